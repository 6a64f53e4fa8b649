"""Result tables of CAFF's Tables 1–2 (Pfeiffer et al.) from their plans and runs.

The plans (what every method trains under each budget) come from :mod:`subfl_book.catalog`
(:func:`~subfl_book.catalog.caff_table1_plan`, :func:`~subfl_book.catalog.caff_table2_plan`); the
functions here turn a plan and its finished runs into the tables the chapter shows, check that every run chose
what the plan says (each method records its per-group choice as a round metric when it starts), compare CAFF
with the best baseline, and describe how the devices' data correlates with their strength (CAFF §4.4).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from subfl.experiments.config import ExperimentConfig
from subfl.experiments.runner import RunResult

from .verdict import seed_ordering

ROUND_METRIC = {"caff": "trained_layers", "hetlora": "lora_rank", "fedhm": "rank_ratio", "depthfl": "trained_layers",
                "heterofl-ft": "width", "fjord-ft": "width", "fedrolex-ft": "width"}
"""The round metric in which each method records the configuration it chose for a group (a client's ``t_c``, LoRA
rank, rank ratio, depth or width)."""

METHOD_NAMES = {"caff": "CAFF", "hetlora": "HetLoRA", "fedhm": "FedHM", "depthfl": "DepthFL",
                "heterofl-ft": "HeteroFL", "fjord-ft": "FjORD", "fedrolex-ft": "FedRolex"}
"""The paper's names of the methods of Tables 1–2."""

_SUBSCRIPT = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def model_name(layers: int, trained: int | None = None) -> str:
    """The paper's name of a pretrained depth, F_l, or of layer finetuning F_l^t, as text: ``model_name(3, 1)`` is
    "F₃¹" (Unicode sub- and superscript digits, readable in table cells and plot labels where math is not set)."""
    name = "F" + str(int(layers)).translate(_SUBSCRIPT)
    return name if trained is None else name + str(int(trained)).translate(_SUPERSCRIPT)


_FORMS = {"hetlora": "{model} LoRA r={s}", "fedhm": "{model} ρ={s}", "depthfl": "{model} d={s}"}


def plan_labels(plan: pd.DataFrame) -> list[str]:
    """What each plan row trains, as text (:func:`model_name`): ``F₉¹`` (CAFF, the last layer of F_9), ``F₆ LoRA r=24``,
    ``F₃ ρ=0.5`` (FedHM), ``F₉ d=2`` (DepthFL), ``F₉ s=0.25`` (width slicing); a Table 2 plan (columns ``weak`` /
    ``strong``) writes both groups' settings, weak first: ``F₆³/F₆⁶`` for CAFF, ``F₆ d=3/6`` otherwise. ``†`` marks a
    model other than CAFF's, ``"—"`` a row where nothing fits."""
    two_groups = "weak" in plan.columns
    labels = []
    for row in plan.itertuples():
        if row.mark == "—":
            labels.append("—")
            continue
        layers = int(row.layers)
        if row.method == "caff":
            trained = (row.weak, row.strong) if two_groups else (row.setting,)
            label = "/".join(model_name(layers, int(t)) for t in trained)
        else:
            setting = f"{row.weak:g}/{row.strong:g}" if two_groups else f"{row.setting:g}"
            label = _FORMS.get(row.method, "{model} s={s}").format(model=model_name(layers), s=setting)
        labels.append(label + row.mark)
    return labels


WIDTH_METHODS = ("heterofl-ft", "fjord-ft", "fedrolex-ft")
"""The width-slicing baselines: their devices train width-``s`` slices of the pretrained model, and each run also
evaluates the leading slice of every width assigned (groups ``"0.5"``, ``"0.25"`` … of its accuracy)."""


def evaluated_model(result: RunResult) -> str:
    """Which of a run's evaluation models stands for its method in the tables: ``"global"``, except for a
    width-slicing method (:data:`WIDTH_METHODS`) whose devices all train below full width — then the leading slice of
    the largest width any device trained (``"0.5"``). Nobody trains the channels outside it: in the full-width model
    they keep their pretrained values and meet head columns that were never trained, so it scores at chance or below
    on a new classification head, while HeteroFL's server model is the largest client model in its paper. Choosing
    the largest trained slice gives these baselines their best defensible evaluation."""
    if result.config.method not in WIDTH_METHODS:
        return "global"
    h = result.history
    widths = [float(g) for g in h[h.metric == "accuracy"].group.unique() if g != "global"]
    if not widths or max(widths) >= 1.0:
        return "global"
    return f"{max(widths):g}"


def _values(results: Sequence[RunResult], metric: str) -> pd.Series:
    return pd.Series([r.final(metric, evaluated_model(r)) for r in results], dtype=float)


def _evaluated(results: Sequence[RunResult]) -> str:
    """The ``evaluated`` column: ``"global"`` or ``"width 0.5"`` (several values joined when the seeds differ)."""
    keys = sorted({evaluated_model(r) for r in results})
    return ", ".join(k if k == "global" else f"width {k}" for k in keys) if keys else "—"


def _chose_planned(results: Sequence[RunResult], method: str, planned: Mapping[str, float]) -> bool | str:
    """Did every run record, for every group, the configuration the plan gives it? ``"—"`` without runs."""
    if not results:
        return "—"
    history = pd.concat([r.history for r in results])
    chosen = history[history.metric == ROUND_METRIC[method]]
    return all(len(chosen[chosen.group == g]) > 0 and (chosen[chosen.group == g].value - v).abs().max() < 1e-9
               for g, v in planned.items())


def _global_accuracy(results: Sequence[RunResult]) -> float:
    """Mean final accuracy of the full-width ``"global"`` model (differs from ``accuracy`` only for width slicing)."""
    return float(np.mean([r.final("accuracy") for r in results])) if results else float("nan")


def table2_results(plan: pd.DataFrame, runs: Mapping[tuple[str, str], Sequence[RunResult]], *,
                   metrics: Sequence[str] = ("accuracy",), data_root: str | os.PathLike | None = None,
                   ) -> pd.DataFrame:
    """One row per row of a Table 2 plan (:func:`~subfl_book.catalog.caff_table2_plan`) with its runs
    ``runs[(constraint, method)]`` (one per seed; a missing key: nothing fits). Columns: ``constraint``,
    ``method``, ``trains`` (:func:`plan_labels`), ``seeds``, ``evaluated`` (the model scored, :func:`evaluated_model`);
    for each of ``metrics`` the mean and the sample standard deviation over the seeds of its final value
    (``<metric>`` / ``<metric> sd``); ``global accuracy`` (the full-width model's); ``weak_f1``, ``strong_f1``,
    ``macro_f1`` (and ``weak_f1 sd``) of the evaluated model on the test set
    (:func:`~subfl_book.analysis.weak_device_f1_table`, weak group ``"0.5"``, strong ``"1"``); and
    ``run chose the planned setting``."""
    from .analysis import weak_device_f1_table

    rows = []
    for row, trains in zip(plan.itertuples(), plan_labels(plan)):
        results = list(runs.get((row.constraint, row.method), []))
        f1 = weak_device_f1_table(results, data_root=data_root, model=evaluated_model) if results else pd.DataFrame(
            columns=["weak_f1", "strong_f1", "macro_f1"], dtype=float)
        entry = {"constraint": row.constraint, "method": row.method, "trains": trains, "seeds": len(results),
                 "evaluated": _evaluated(results)}
        for metric in metrics:
            values = _values(results, metric)
            entry[metric], entry[f"{metric} sd"] = values.mean(), values.std()
        entry["global accuracy"] = _global_accuracy(results)
        entry.update({"weak_f1": f1["weak_f1"].mean(), "weak_f1 sd": f1["weak_f1"].std(),
                      "strong_f1": f1["strong_f1"].mean(), "macro_f1": f1["macro_f1"].mean(),
                      "run chose the planned setting": _chose_planned(results, row.method,
                                                                      {"0.5": row.weak, "1": row.strong})})
        rows.append(entry)
    return pd.DataFrame(rows)


def table1_results(plan: pd.DataFrame, runs: Mapping[tuple[str, float, str], Sequence[RunResult]], *,
                   metrics: Sequence[str] = ("accuracy",)) -> pd.DataFrame:
    """One row per row of a Table 1 plan (:func:`~subfl_book.catalog.caff_table1_plan`) with its runs
    ``runs[(constraint, level, method)]``: ``constraint``, ``level``, ``method``, ``trains``, ``seeds``,
    ``evaluated`` (:func:`evaluated_model`), the mean (and sd) of every metric's final value for the evaluated model,
    ``global accuracy`` (the full-width model's) and ``run chose the planned setting`` (every device is in group
    ``"1"``)."""
    rows = []
    for row, trains in zip(plan.itertuples(), plan_labels(plan)):
        results = list(runs.get((row.constraint, row.level, row.method), []))
        entry = {"constraint": row.constraint, "level": row.level, "method": row.method, "trains": trains,
                 "seeds": len(results), "evaluated": _evaluated(results)}
        for metric in metrics:
            values = _values(results, metric)
            entry[metric], entry[f"{metric} sd"] = values.mean(), values.std()
        entry["global accuracy"] = _global_accuracy(results)
        entry["run chose the planned setting"] = _chose_planned(results, row.method, {"1": row.setting})
        rows.append(entry)
    return pd.DataFrame(rows)


def caff_against_baselines(table: pd.DataFrame, metric: str, *, by: Sequence[str] = ("constraint",),
                           higher_is_better: bool = True) -> pd.DataFrame:
    """Per cell ``by`` of a results table (:func:`table2_results` / :func:`table1_results`): CAFF's ``metric``, the
    best baseline's (among the rows that ran), the best baseline's on CAFF's own model (rows not marked ``†``),
    ``margin`` (CAFF minus the best baseline, sign flipped when lower is better, so positive means CAFF is ahead),
    ``spread`` (``sd_CAFF + sd_best``, the margin the verdict rule's bands must exceed to be apart) and ``status``:
    :func:`~subfl_book.verdict.seed_ordering` of CAFF against the best baseline (``"ahead"``, ``"behind"``,
    ``"within seed spread"``, ``"inconclusive (n < 3)"`` with fewer than three seeds), or ``"n/a (no baseline
    fits)"`` / ``"n/a (CAFF does not fit)"``. The table needs ``seeds`` and ``<metric> sd`` columns."""
    for column in (metric, f"{metric} sd", "seeds"):
        if column not in table.columns:
            raise ValueError(f"metric={metric!r} needs a column {column!r} in table; columns: {list(table.columns)}")
    sign = 1.0 if higher_is_better else -1.0
    sd_column = f"{metric} sd"
    rows = []
    for key, sub in table.groupby(list(by), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        entry = dict(zip(by, key))
        mine = sub[sub.method == "caff"]
        rivals = sub[(sub.method != "caff") & sub[metric].notna()]
        if mine.empty or mine[metric].isna().all():
            rows.append({**entry, "status": "n/a (CAFF does not fit)"})
            continue
        mine = mine.iloc[0]
        if rivals.empty:
            rows.append({**entry, "CAFF": mine[metric], "status": "n/a (no baseline fits)"})
            continue
        best = rivals.loc[(sign * rivals[metric]).idxmax()]
        same = rivals[~rivals.trains.str.endswith("†")]
        margin = sign * (mine[metric] - best[metric])
        sd_mine, sd_best = (0.0 if v != v else float(v) for v in (mine[sd_column], best[sd_column]))
        spread = sd_mine + sd_best
        status = seed_ordering((mine[metric], sd_mine, int(mine["seeds"])), (best[metric], sd_best, int(best["seeds"])),
                               higher_is_better=higher_is_better)
        best_same = same.loc[(sign * same[metric]).idxmax()] if len(same) else None
        rows.append({**entry, "CAFF": mine[metric], "best baseline": METHOD_NAMES.get(best.method, best.method),
                     "its value": best[metric], "margin": margin, "spread": spread, "status": status,
                     "best on CAFF's model": "—" if best_same is None else
                     f"{METHOD_NAMES.get(best_same.method, best_same.method)} {best_same[metric]:.4g}"})
    return pd.DataFrame(rows)


def group_class_shares(config: ExperimentConfig, *, weak_groups: Sequence[str] = ("0.5",),
                       data_root: str | os.PathLike | None = None) -> pd.DataFrame:
    """How the training data of a run's devices splits by class between the weak group and the rest (CAFF §4.4's
    correlation between data and device strength). One row per class: ``weak_samples``, ``other_samples``,
    ``weak_share`` — the fraction of the class's training samples held by weak devices — and ``weak_p`` /
    ``other_p``, each group's class occurrence probabilities (the weights of the weak-device F1). The groups are
    the engine's profile draw of round 1 for ``config.seed``; the partition is the run's."""
    from .analysis import group_members
    from subfl.experiments.runner import client_splits, prepare_data

    dataset, _, parts = prepare_data(config, data_root)
    train_parts = client_splits(config, parts)[0]
    weak = group_members(config, weak_groups)
    labels = np.asarray(dataset.train.labels)
    is_weak = np.zeros(len(train_parts), dtype=bool)
    is_weak[weak] = True
    count = lambda members: np.bincount(np.concatenate([labels[train_parts[c]] for c in members] or [[]]).astype(int),
                                        minlength=dataset.num_classes)  # noqa: E731
    weak_counts = count(np.flatnonzero(is_weak))
    other_counts = count(np.flatnonzero(~is_weak))
    totals = weak_counts + other_counts
    return pd.DataFrame({"weak_samples": weak_counts, "other_samples": other_counts,
                         "weak_share": np.divide(weak_counts, totals, out=np.full(len(totals), np.nan),
                                                 where=totals > 0),
                         "weak_p": weak_counts / max(1, weak_counts.sum()),
                         "other_p": other_counts / max(1, other_counts.sum())},
                        index=pd.Index(list(dataset.class_names), name="class"))


__all__ = ["METHOD_NAMES", "ROUND_METRIC", "WIDTH_METHODS", "caff_against_baselines", "evaluated_model",
           "model_name", "group_class_shares", "plan_labels", "table1_results", "table2_results"]
