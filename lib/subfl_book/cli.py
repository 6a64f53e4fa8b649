"""``subfl-book``: execute the book's stale notebooks from the run store and build the site."""
from __future__ import annotations

import argparse
import sys

from . import pipeline, scorecard_page


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="subfl-book", description=__doc__)
    parser.add_argument("--scale", default="cpu", help="ci | cpu | paper (default cpu: what the book shows)")
    parser.add_argument("--only", default=None, help="only this chapter (folder under notebooks/)")
    parser.add_argument("--force", action="store_true", help="re-execute even fresh notebooks")
    parser.add_argument("--status", action="store_true", help="list which executed notebooks are stale, and why")
    parser.add_argument("--no-build", action="store_true", help="execute notebooks but do not build the site")
    parser.add_argument("--build-only", action="store_true",
                        help="build the site from the executed copies as they are (stale ones included)")
    parser.add_argument("--scorecard", action="store_true",
                        help="regenerate the Scorecard page and the status counts of the intro and README, then stop")
    parser.add_argument("--sync-prose", action="store_true",
                        help="copy the sources' markdown into the executed copies that run the same code, put a "
                             "notice on the stale ones, then stop")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks executed at a time (default 1)")
    parser.add_argument("--verify", action="store_true",
                        help="execute every fresh page again (from the store, into a scratch folder) and compare every "
                             "output with its committed copy; exit 1 when one moved")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.status:
            for row in pipeline.status(scale=args.scale, only=args.only):
                print(f"{row.state:8s} {row.notebook}  ({row.reason})")
            return 0
        if args.verify:
            moved = [r for r in pipeline.verify(scale=args.scale, only=args.only) if r.differing_cells]
            print(f"{len(moved)} page(s) whose outputs moved" if moved else "every fresh page re-executes identically")
            return 1 if moved else 0
        if args.scorecard:
            changed = scorecard_page.write(pipeline.project_root())
            print("\n".join(f"rewrote {p}" for p in changed) or "scorecard up to date")
            return 0
        if args.sync_prose:
            synced = pipeline.sync_all_prose(only=args.only)
            print("\n".join(f"synced {p}" for p in synced) or "every executed copy shows its source's prose")
            marked = pipeline.mark_stale_pages(scale=args.scale, only=args.only)
            print("\n".join(f"stale notice updated: {p}" for p in marked) or "every stale page carries its notice")
            return 0
        if args.build_only and (args.no_build or args.force):
            raise ValueError("--build-only cannot be combined with --no-build or --force")
        if not args.build_only:
            pipeline.execute(scale=args.scale, only=args.only, force=args.force, jobs=args.jobs)
        if not args.no_build:
            pipeline.sync_all_prose(only=args.only)
            pipeline.mark_stale_pages(scale=args.scale, only=args.only)
            scorecard_page.write(pipeline.project_root())
            pipeline.build_site()
    except (ValueError, FileNotFoundError) as err:
        print(f"subfl-book: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
