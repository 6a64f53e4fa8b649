"""Plan: the runs the given pages read that the store lacks (to compute them elsewhere with ``compute_runs.py``).

Each page's code cells run at the ``cpu`` scale with a stand-in for every run the store lacks: the record of the
most similar stored run (same method, dataset and model where there is one) under the asked config, with the
method's initial server state for its weights (built from the asked config, so an analysis of final weights gets
tensors of the right shapes), so the page goes on to ask for its next runs. What the page computes from stand-ins is thrown away; only the list of missing
runs is kept. The page's code cells run one by one: a cell whose analysis breaks on a stand-in is reported and
the next cell runs, so a plan misses only runs asked for after the break inside that cell (or from names it
failed to define); re-planning after the first runs are recorded finds the rest.

Each planned run carries ``estimated_cpu_s``: the median seconds per client-epoch of the store's one-thread CPU
records of its dataset, model and width, times its rounds × active clients × local epochs (``None`` where the
store holds no such record); a rough guide for sharing the runs between machines, not a measurement.

    python scripts/plan_runs.py notebooks/spectral/training.ipynb --out plan.json
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import gzip
import io
import json
import sys
from pathlib import Path


def client_epochs(config: dict) -> int:
    """Client updates of a run, counted in client-epochs (a run that counts local steps: one per client-round)."""
    return config["rounds"] * config["clients_per_round"] * (config.get("local_epochs") or 1)


def run_kind(config: dict) -> tuple[str, str, float]:
    """What sets a run's cost per client-epoch: ``(dataset, model, width)``. FedAvg's ResNet-18 runs on CIFAR-10
    in the store take 6.3 s per client-epoch at width 0.25 and 1.2 s at width 0.125: a rate by dataset and model
    alone misleads."""
    return config["dataset"], config["model"], float(config.get("width") or 1.0)


def cpu_rates(records: list[dict]) -> dict[tuple[str, str, float], float]:
    """Median wall seconds per client-epoch (every stage of the run) of the one-thread CPU records, by
    :func:`run_kind`."""
    import statistics

    rates: dict[tuple[str, str, float], list[float]] = {}
    for record in records:
        env = record.get("environment", {})
        if env.get("device") != "cpu" or env.get("threads") != 1:
            continue
        seconds = sum(dict(record["timings"]).get("seconds", []))
        config = record["config"]
        rates.setdefault(run_kind(config), []).append(seconds / client_epochs(config))
    return {kind: statistics.median(values) for kind, values in rates.items()}


def estimated_cpu_seconds(config: dict, rates: dict[tuple[str, str, float], float]) -> float | None:
    """One thread's wall seconds for ``config`` at the recorded rate of its :func:`run_kind` (``None``: no record of
    that dataset, model and width)."""
    rate = rates.get(run_kind(config))
    return None if rate is None else round(rate * client_epochs(config), 1)


def with_metrics_of(dataset: str, history, records: list[dict]):
    """``history`` plus, for every metric the ``records`` of ``dataset`` report and ``history`` lacks (e.g. the
    perplexity of a next-token task), that metric's rows as copies of the ``loss`` rows: a stand-in record of
    another dataset then has the metrics a page of the asked dataset reads."""
    import pandas as pd

    reported = set().union(*(dict(r["history"])["metric"] for r in records if r["config"].get("dataset") == dataset))
    grafts = [history[history.metric == "loss"].assign(metric=metric)
              for metric in sorted(reported - set(history.metric))]
    return pd.concat([history, *grafts], ignore_index=True) if grafts else history


def plan_page(page: Path) -> tuple[list[dict], list[str]]:
    """``(missing runs, errors)`` of one page: each missing run as ``{"key", "config", "keep_state", "label"}``;
    one error per code cell that broke on a stand-in (the cells after it still run)."""
    import matplotlib

    matplotlib.use("Agg")
    import nbformat

    import subfl_book
    import subfl_book.store as store
    from subfl_book import final_analyses

    class StandIn(store.StoredRun):
        """A stored record under the asked config; its weights are the method's initial server state."""

        def __init__(self, config, record, state_file):
            super().__init__(config, record, state_file)
            if record["config"].get("model") != config.model:
                del self.__dict__["ledger"]  # another model's tensor names: built from the asked model below
            if record["config"].get("dataset") != config.dataset:
                self.__dict__["history"] = with_metrics_of(config.dataset, self.history, records)
            self.analyses = {}  # another run's values: a page's analyses are computed from the initial weights

        @functools.cached_property
        def context(self):
            from subfl.experiments.runner import prepare_data, server_context

            dataset, _, _ = prepare_data(self.config)
            return server_context(self.config, dataset, device="cpu")

        def has_state(self):
            return True

        def state(self):
            from subfl.methods import make_method

            method = make_method(self.config.method, **dict(self.config.method_options))
            return method.init(self.context)

        @functools.cached_property
        def ledger(self):
            """The stand-in's ledger with the asked model's tensors: every tensor of the model, dense, in
            each (round, client, direction) the stand-in record has."""
            import pandas as pd
            recorded = store._frame(self._record["ledger"])
            tensors = self.context.model_fn().state_dict()
            rows = [{"round": rnd, "client": client, "direction": direction, "name": name,
                     "bytes": value.numel() * value.element_size()}
                    for (rnd, client, direction), _ in recorded.groupby(["round", "client", "direction"])
                    for name, value in tensors.items()]
            return pd.DataFrame(rows, columns=list(recorded.columns)).fillna(0)

    records = [json.loads(gzip.decompress(p.read_bytes())) for p in store.store_root().glob("??/*.json.gz")]
    if not records:
        raise SystemExit("the store holds no record to stand in for a missing run")
    rates = cpu_rates(records)
    missing: dict[str, dict] = {}

    def similarity(record: dict, config) -> int:
        theirs = record["config"]
        return 4 * (theirs.get("method") == config.method) + 2 * (theirs.get("dataset") == config.dataset) \
            + (theirs.get("model") == config.model)

    def planned_run(config, *, data_root=None, progress=None, keep_state=False, same_environment=False,
                    analyses=None):
        found = store.key_to_read(config, keep_state, analyses=analyses)
        if found is not None:
            return store.load_record(config, found, store.root_for(config))
        key = store.book_key(config)
        entry = missing.setdefault(key, {"key": key, "config": config.to_dict(), "keep_state": False,
                                         "analyses": [], "label": config.label(),
                                         "estimated_cpu_s": estimated_cpu_seconds(config.to_dict(), rates)})
        entry["keep_state"] |= keep_state
        entry["analyses"] = [list(r) for r in final_analyses.normalise([*entry["analyses"], *(analyses or [])])]
        stand_in = max(records, key=lambda r: similarity(r, config))
        run = StandIn(config, stand_in, Path("/nonexistent/stand-in.state.pt"))
        run._record = stand_in
        return run

    store.run_experiment = planned_run
    subfl_book.run_experiment = planned_run
    cells = []
    for cell in nbformat.read(page, as_version=4).cells:
        if cell.cell_type == "code":
            tagged = "parameters" in cell.metadata.get("tags", [])
            cells.append(cell.source + ('\nscale = "cpu"' if tagged else ""))
    namespace = {"display": lambda *a, **k: None, "__name__": "__main__"}
    errors = []
    for number, source in enumerate(cells, start=1):
        try:  # the page's own printing (tables, scorecard HTML) is no part of the plan's report
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(source, f"{page} (code cell {number})", "exec"), namespace)
        except Exception as exc:  # a stand-in broke this cell's analysis: later cells may still ask for runs
            errors.append(f"code cell {number}: {type(exc).__name__}: {exc}"[:300])
    return list(missing.values()), errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="+", type=Path, help="source notebooks (notebooks/<chapter>/<page>.ipynb)")
    parser.add_argument("--out", type=Path, required=True, help="plan JSON to write")
    args = parser.parse_args(argv)
    from subfl_book import final_analyses

    for page in args.pages:
        if not page.is_file():
            parser.error(f"page {page} is not a file; accepted: notebooks/<chapter>/<page>.ipynb")
    plan: dict[str, dict] = {}
    for page in args.pages:
        missing, errors = plan_page(page)
        for entry in missing:
            row = plan.setdefault(entry["key"], {**entry, "pages": []})
            row["keep_state"] |= entry["keep_state"]
            row["analyses"] = [list(r) for r in final_analyses.normalise([*row["analyses"], *entry["analyses"]])]
            row["pages"].append(page.as_posix())
        broke = (f" ({len(errors)} code cells broke on stand-ins, the plan may be incomplete; first: {errors[0]})"
                 if errors else "")
        estimates = [entry["estimated_cpu_s"] for entry in missing]
        known = [seconds for seconds in estimates if seconds is not None]
        cost = (f", about {sum(known) / 3600:.1f} one-thread CPU hours"
                + (f" (and {len(estimates) - len(known)} runs of a dataset, model and width with no CPU record)"
                   if len(known) < len(estimates) else "")) if missing else ""
        print(f"{page}: {len(missing)} runs missing{cost}{broke}", flush=True)
    args.out.write_text(json.dumps(list(plan.values()), indent=1, default=list))
    return 0


if __name__ == "__main__":
    sys.exit(main())
