"""Command line: ``subfl run ...`` runs one experiment, ``subfl list`` names what can be run (the book has its own
command, ``subfl-book``)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _string_fields() -> set[str]:
    import dataclasses

    from .experiments import ExperimentConfig

    return {f.name for f in dataclasses.fields(ExperimentConfig) if str(f.type).startswith("str")}


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs → config overrides; ``method.x=1`` / ``model.x`` / ``dataset.x`` go to the options.

    Values are read as JSON (numbers, lists, null, true/false) except for the config's string fields
    (``heterogeneity=0.2`` stays the string ``"0.2"``)."""
    strings = _string_fields()
    overrides: dict[str, Any] = {}
    options: dict[str, dict[str, Any]] = {"method": {}, "model": {}, "dataset": {}}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        prefix, _, name = key.partition(".")
        if name and prefix in options:
            options[prefix][name] = _parse_value(value)
        else:
            overrides[key] = value if key in strings else _parse_value(value)
    for prefix, values in options.items():
        if values:
            overrides[f"{prefix}_options"] = values
    return overrides


def _cmd_run(args: argparse.Namespace) -> int:
    from .experiments import make_config, run_experiment

    overrides = parse_sets(args.set or [])
    if args.alpha is not None:
        overrides["alpha"] = args.alpha
    config = make_config(args.method, args.dataset, args.model, args.partition, scale=args.scale, seed=args.seed,
                         **overrides)
    result = run_experiment(config, args.out, cache=args.cache, data_root=args.data_root,
                            progress=None if not args.quiet else False)
    s = result.summary
    print(f"{config.label()}: final accuracy {s['final_accuracy']:.4f} after {s['rounds']} rounds, "
          f"{s['wall_time_s']:.1f} s, upload {s['upload_bytes'] / 1e6:.2f} MB, download "
          f"{s['download_bytes'] / 1e6:.2f} MB → {result.directory}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from .data import DATASETS, PARTITIONS
    from .experiments import SCALES
    from .methods import METHODS
    from .models import MODELS

    print("methods:    " + ", ".join(sorted(METHODS)))
    print("datasets:   " + ", ".join(DATASETS))
    print("models:     " + ", ".join(MODELS))
    print("partitions: " + ", ".join(PARTITIONS))
    print("scales:     " + ", ".join(SCALES))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="subfl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment")
    run.add_argument("method")
    run.add_argument("--dataset", required=True)
    run.add_argument("--model", default=None, help="default: the dataset's usual model")
    run.add_argument("--partition", default="iid")
    run.add_argument("--alpha", type=float, default=None, help="Dirichlet concentration")
    run.add_argument("--scale", default="cpu", help="ci | cpu | paper")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a config field (e.g. rounds=5, method.kappa=4); repeatable")
    run.add_argument("--out", required=True, help="output folder (history.csv, summary.json, ledger.csv)")
    run.add_argument("--data-root", default=None, help="dataset folder (default: $SUBFL_DATA_ROOT or data/)")
    run.add_argument("--cache", action="store_true", help="reuse a finished run with the same run key from this machine's run cache")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=_cmd_run)
    ls = sub.add_parser("list", help="list methods, datasets, models, partitions and scales")
    ls.set_defaults(func=_cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"subfl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
