"""Command line: ``subfl run ...`` runs one experiment, ``subfl list`` names what can be run (the book has its own
command, ``subfl-book``).

Bad input — an unknown name, a value of the wrong type or out of range, a setting the run would ignore, an ``--out``
that cannot hold the run — is refused before any data is loaded, with one line naming the parameter and what is
accepted, and exit status 2. A run that diverges is a result: it is reported with exit status 0."""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

OWN_FLAGS = {"method": "the METHOD argument", "dataset": "--dataset", "model": "--model", "partition": "--partition",
             "alpha": "--alpha", "scale": "--scale", "seed": "--seed"}
"""Config fields that ``subfl run`` sets with their own argument (``--set`` refuses them)."""

OPTION_PREFIXES = ("method", "model", "dataset")
"""``--set PREFIX.NAME=VALUE`` sets option NAME of the method / model / dataset."""


class UsageError(ValueError):
    """Bad command-line input (reported on one line, exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _string_fields() -> dict[str, bool]:
    """The config's string fields → whether they may be None (``--set norm=null``)."""
    import dataclasses

    from .experiments import ExperimentConfig

    return {f.name: "None" in str(f.type) for f in dataclasses.fields(ExperimentConfig)
            if str(f.type).startswith("str")}


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs → config overrides; ``method.x=1`` / ``model.x`` / ``dataset.x`` go to the options.

    Values are read as JSON (numbers, lists, null, true/false) except for the config's string fields
    (``heterogeneity=0.2`` stays the string ``"0.2"``; ``null`` is None where the field may be None).
    :class:`UsageError` for a malformed item, a key given twice, or a field that has its own flag
    (:data:`OWN_FLAGS`)."""
    strings = _string_fields()
    overrides: dict[str, Any] = {}
    options: dict[str, dict[str, Any]] = {prefix: {} for prefix in OPTION_PREFIXES}
    seen: set[str] = set()
    for item in items:
        if "=" not in item:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        key = key.strip()
        if not key:
            raise UsageError(f"--set {item!r} has no KEY; expected KEY=VALUE (a config field, or method.NAME / "
                             f"model.NAME / dataset.NAME for an option)")
        if key in seen:
            raise UsageError(f"--set {key} is given twice; give each key once")
        seen.add(key)
        prefix, dot, name = key.partition(".")
        if dot and prefix in options:
            if not name:
                raise UsageError(f"--set {item!r} names no option after {prefix!r}.; expected {prefix}.NAME=VALUE")
            options[prefix][name] = _parse_value(value)
        elif key in OWN_FLAGS:
            raise UsageError(f"--set {key}=... is not accepted: {key} has its own argument ({OWN_FLAGS[key]})")
        elif key in strings:
            overrides[key] = None if strings[key] and value == "null" else value
        else:
            overrides[key] = _parse_value(value)
    for prefix, values in options.items():
        if values:
            if f"{prefix}_options" in overrides:
                raise UsageError(f"--set {prefix}_options=... and --set {prefix}.NAME=... are both given; use one")
            overrides[f"{prefix}_options"] = values
    return overrides


def _check_data_root(data_root: str | None) -> None:
    if data_root is None:
        return
    path = Path(data_root)
    if not data_root.strip() or not path.exists():
        raise UsageError(f"--data-root {data_root!r} does not exist; accepted: the folder holding the dataset files "
                         f"(default: $SUBFL_DATA_ROOT or data/)")
    if not path.is_dir():
        raise UsageError(f"--data-root {data_root} is a file; accepted: the folder holding the dataset files")


def _configure(args: argparse.Namespace):
    """The run's config, after every check that needs no data (``ValueError`` / ``TypeError`` otherwise)."""
    from .experiments import make_config
    from .experiments.config import ConfigWarning, ignored_settings
    from .experiments.runner import check_device_available, check_out_dir

    overrides = parse_sets(args.set or [])
    if args.alpha is not None:
        overrides["alpha"] = args.alpha
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)  # refused below, on one line
        config = make_config(args.method, args.dataset, args.model, args.partition, scale=args.scale,
                             seed=args.seed, **overrides)
    for _, message in ignored_settings(config):
        raise UsageError(message)
    check_out_dir(args.out)
    _check_data_root(args.data_root)
    check_device_available(config.device)
    return config


def _divergence(result) -> str:
    """Why the engine stopped a run (:func:`subfl.fl.engine.run_simulation`): a loss that was not finite, or a
    round's mean training loss above the explosion threshold (then the history holds that round's loss)."""
    history = result.history
    last = history[history["round"] == result.summary["diverged_at_round"]]
    loss = last.loc[last["metric"] == "train_loss", "value"]
    if loss.empty:
        return "a client's training loss was not finite"
    from .fl.engine import EXPLOSION_FACTOR

    return (f"the round's mean training loss, {loss.iloc[-1]:.4g}, exploded past {EXPLOSION_FACTOR:g} × the loss of "
            f"a uniform guess over the classes")


def _report(config, result) -> str:
    """The line ``subfl run`` prints for a finished (or diverged) run."""
    s = result.summary
    where = f"→ {result.directory}" + (" (read back: a finished identical run)" if result.from_cache else "")
    traffic = (f"upload {s.get('upload_bytes', 0) / 1e6:.2f} MB, download {s.get('download_bytes', 0) / 1e6:.2f} MB")
    if s.get("diverged_at_round") is not None:
        return (f"{config.label()}: diverged in round {s['diverged_at_round']} ({_divergence(result)}): no final "
                f"accuracy; the history up to that round is kept; {s.get('wall_time_s', 0):.1f} s, {traffic} {where}")
    accuracy = s.get("final_accuracy")
    measured = f"final accuracy {accuracy:.4f}" if isinstance(accuracy, (int, float)) else "no accuracy recorded"
    return (f"{config.label()}: {measured} after {s.get('rounds')} rounds, {s.get('wall_time_s', 0):.1f} s, "
            f"{traffic} {where}")


def _cmd_run(args: argparse.Namespace) -> int:
    from .experiments import run_experiment

    try:
        config = _configure(args)
    except (ValueError, TypeError, OSError) as err:  # bad input, found before any data is loaded
        print(f"subfl: error: {err}", file=sys.stderr)
        return 2
    if args.engine == "flower":
        from .flower import available

        if not available():
            print("subfl: error: --engine flower needs Flower: pip install 'subfl[flower]'", file=sys.stderr)
            return 2
        if args.cache:
            print("subfl: error: --cache applies to --engine local (the run cache holds in-process runs)",
                  file=sys.stderr)
            return 2
    try:
        if args.engine == "flower":
            from .flower.simulation import run_experiment_flower

            result = run_experiment_flower(config, args.out, data_root=args.data_root)
        else:
            result = run_experiment(config, args.out, cache=args.cache, data_root=args.data_root,
                                    progress=None if not args.quiet else False)
    except KeyboardInterrupt:
        print(f"subfl: interrupted; the same command resumes from the last checkpoint in {args.out}", file=sys.stderr)
        return 130
    print(_report(config, result))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from .data import DATASETS, PARTITIONS
    from .experiments import SCALES
    from .experiments.config import UNRUNNABLE_PARTITIONS
    from .methods import METHODS
    from .models import MODELS

    print("methods:    " + ", ".join(sorted(METHODS)))
    print("datasets:   " + ", ".join(DATASETS))
    print("models:     " + ", ".join(MODELS))
    print("partitions: " + ", ".join(p for p in PARTITIONS if p not in UNRUNNABLE_PARTITIONS))
    print("scales:     " + ", ".join(SCALES))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="subfl", description=__doc__)
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
    run.add_argument("--engine", choices=("local", "flower"), default="local",
                     help="local: the in-process engine; flower: Flower's simulation runtime (extra 'flower')")
    run.set_defaults(func=_cmd_run)
    ls = sub.add_parser("list", help="list methods, datasets, models, partitions and scales")
    ls.set_defaults(func=_cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, PermissionError) as err:  # found while running: missing data files, a
        print(f"subfl: error: {err}", file=sys.stderr)                # checkpoint or finished run of another config
        return 2


if __name__ == "__main__":
    sys.exit(main())
