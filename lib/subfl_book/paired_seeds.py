"""One method's runs in two settings side by side, paired by seed.

Several pages set a run of theirs beside the same method's run on another page (keep ratio 0.1 against 0.2, a mixed
0.2 / 0.4 population against all clients at 0.2, one sub-model method against another at the same keep ratio). The
runs of the two settings share their seeds, so the fair difference is the per-seed one: it removes what a seed does
to both (its data split and initialisation). These helpers build such tables from the store's runs, so a table goes
stale with the records it reads instead of being typed into a page's prose.

A run that diverged has no final value (:meth:`~subfl.experiments.runner.RunResult.final` is NaN); it is named with
its round and left out of means and differences, never counted as zero.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import pandas as pd

from subfl.experiments.runner import RunResult


def _value(run: RunResult, percent: bool) -> float:
    return (100.0 if percent else 1.0) * run.final()


def _diverged_label(run: RunResult) -> str:
    return f"diverged (round {run.summary.get('diverged_at_round', '?')})"


def seeds_label(runs: Sequence[RunResult], *, percent: bool = False, per_seed: bool = True) -> str:
    """``"mean ± sd"`` of the runs' final accuracy over the seeds that trained (4 decimals, or 2 in ``percent``),
    followed by each seed's value in the runs' order (``per_seed``) or, without it, by how many seeds trained when
    some diverged. One trained seed: its value alone; none: ``"diverged on every seed"`` (with the round of each when
    ``per_seed``). Raises for no runs: the caller says why a setting was not run."""
    if not runs:
        raise ValueError("runs is empty; accepted: at least one run (name a setting that was not run yourself)")
    digits = 2 if percent else 4
    trained = [_value(r, percent) for r in runs if not r.diverged]
    seeds = " / ".join(_diverged_label(r) if r.diverged else f"{_value(r, percent):.{digits}f}" for r in runs)
    if not trained:
        rounds = " / ".join(str(r.summary.get("diverged_at_round", "?")) for r in runs)
        return f"diverged on every seed (rounds {rounds})" if per_seed and len(runs) > 1 else "diverged on every seed"
    if len(trained) == 1:
        stat = f"{trained[0]:.{digits}f}"
    else:
        stat = f"{statistics.mean(trained):.{digits}f} ± {statistics.stdev(trained):.{digits}f}"
    if per_seed and len(runs) > 1:
        return f"{stat} ({seeds})"
    return stat if len(trained) == len(runs) else f"{stat} ({len(trained)} of {len(runs)} seeds)"


def paired_points(first: Sequence[RunResult], second: Sequence[RunResult]) -> dict[int, float]:
    """``{seed: 100 · (first's final − second's final)}`` for every seed run in both settings where neither run
    diverged, in ``first``'s order (points when the finals are fractions). Raises when a setting has two runs of one
    seed."""
    by_seed = {}
    for name, runs in (("first", first), ("second", second)):
        seeds = [r.config.seed for r in runs]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{name} has several runs of one seed ({seeds}); accepted: one run per seed")
        by_seed[name] = dict(zip(seeds, runs))
    return {seed: 100.0 * (run.final() - by_seed["second"][seed].final())
            for seed, run in by_seed["first"].items()
            if seed in by_seed["second"] and not (run.diverged or by_seed["second"][seed].diverged)}


def points_label(points: Mapping[int, float], *, per_seed: bool = True) -> str:
    """The mean of per-seed differences in points with a sign (``"+1.6"``), then each seed's (``per_seed``);
    ``"—"`` when there is none."""
    if not points:
        return "—"
    mean = f"{statistics.mean(points.values()):+.1f}"
    return f"{mean} ({', '.join(f'{v:+.1f}' for v in points.values())})" if per_seed else mean


def _same_runs(first: Sequence[RunResult], second: Sequence[RunResult]) -> bool:
    return bool(first) and [r.config for r in first] == [r.config for r in second]


def compare_settings(runs: Mapping[str, tuple[Sequence[RunResult], Sequence[RunResult]]], settings: tuple[str, str],
                     difference: str, *, percent: bool = False, per_seed: bool = True,
                     not_run: str = "—") -> pd.DataFrame:
    """One row per method of ``runs`` (``{method: (runs in the first setting, runs in the second)}``, rows in its
    order, indexed by ``method``): the :func:`seeds_label` of each setting under the column names ``settings``, and
    the per-seed difference first − second in points (:func:`paired_points`, :func:`points_label`) under
    ``difference``. A setting without runs reads ``not_run``; when both settings hold the same runs (one
    configuration serves both pages) the second reads ``"the same runs"`` and the difference ``"—"``."""
    if len(settings) != 2 or settings[0] == settings[1] or difference in settings:
        raise ValueError(f"settings={settings!r}, difference={difference!r} are not valid; accepted: two different "
                         "column names for the settings and a third for the difference")
    rows = []
    for method, (first, second) in runs.items():
        same = _same_runs(first, second)
        row = {"method": method,
               settings[0]: seeds_label(first, percent=percent, per_seed=per_seed) if first else not_run,
               settings[1]: ("the same runs" if same else
                             seeds_label(second, percent=percent, per_seed=per_seed) if second else not_run),
               difference: "—" if same else points_label(paired_points(first, second), per_seed=per_seed)}
        rows.append(row)
    return pd.DataFrame(rows, columns=["method", *settings, difference]).set_index("method")


__all__ = ["compare_settings", "paired_points", "points_label", "seeds_label"]
