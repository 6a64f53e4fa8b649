"""Reading finished runs by client capacity: who had which keep ratio, what each width sent, what it cost.

The engine's ledger records tensors per (round, client, direction) but not the client's keep ratio; that is a
pure function of the run's configuration (:meth:`~subfl.fl.profiles.Heterogeneity.profiles`), recomputed here
exactly as the engine draws it, so per-width traffic is measured from the ledger, not assumed.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd
import torch

from ..costs import count_parameters, training_flops
from ..methods.width import model_width
from ..models.composed import build_composed_models, build_dense_model
from .config import ExperimentConfig
from .runner import RunResult, final_table

IMAGE_SHAPES = {"fmnist": (1, 28, 28), "femnist": (1, 28, 28), "cifar10": (3, 32, 32)}


def client_levels(config: ExperimentConfig, round: int) -> dict[int, float]:
    """``{client: keep ratio}`` in ``round`` (1-based) of a run of ``config`` — the engine's own draw."""
    if round < 1 or round > config.rounds:
        raise ValueError(f"round must be in 1..{config.rounds} (config.rounds), got {round}")
    profiles = config.heterogeneity_setting.profiles(config.num_clients, config.seed, round)
    return {p.client_id: float(p.keep_ratio) for p in profiles}


def payload_by_level(result: RunResult, direction: str = "up") -> pd.DataFrame:
    """Bytes one client moves in one round (``direction`` ``"up"`` or ``"down"``), by its keep ratio.

    Read from the ledger (tensors only; the small JSON config row is left out). One row per keep ratio:
    ``level``, ``client_rounds`` (how many (client, round) payloads were seen), ``bytes_mean`` / ``bytes_min`` /
    ``bytes_max`` and ``tensors`` (tensor count of one payload, its maximum).
    """
    if direction not in ("up", "down"):
        raise ValueError(f"direction must be 'up' or 'down', got {direction!r}")
    ledger = result.ledger
    rows = ledger[(ledger.direction == direction) & (ledger.name != "__config__")]
    per = rows.groupby(["round", "client"]).agg(bytes=("bytes", "sum"), tensors=("name", "count")).reset_index()
    levels = {r: client_levels(result.config, r) for r in per["round"].unique()}
    per["level"] = [levels[r][c] for r, c in zip(per["round"], per["client"])]
    out = per.groupby("level").agg(client_rounds=("bytes", "size"), bytes_mean=("bytes", "mean"),
                                   bytes_min=("bytes", "min"), bytes_max=("bytes", "max"),
                                   tensors=("tensors", "max")).reset_index()
    return out


def width_table(results: Iterable[RunResult], groups: Sequence[str] = ("0.25", "0.5", "0.75", "1"),
                by: Sequence[str] = ("method",), metric: str = "accuracy") -> pd.DataFrame:
    """Final ``metric`` of every evaluated width (history group): :func:`~subfl.experiments.final_table` per group.

    One row per (``by`` fields, ``width``), in the order the runs come in; ``width`` is the group name as a float,
    ``seeds`` the runs with a finite final value. Groups a run never evaluated (e.g. width 0.5 in a two-device-type
    run) are left out; a diverged run counts as NaN (``diverged`` column).
    """
    by, results = list(by), list(results)
    tables = [final_table(ran, metric, g, by).assign(width=float(g)) for g in groups
              if (ran := [r for r in results if r.diverged or not r.curve(metric, g).empty])]
    if not tables:
        raise ValueError(f"no run recorded {metric!r} for any of the groups {list(groups)}")
    order = list(dict.fromkeys(getattr(r.config, by[0]) for r in results))  # keep the callers' order
    table = pd.concat(tables, ignore_index=True).rename(columns={"count": "seeds"})
    return (table.sort_values([by[0], "width"], key=lambda s: s.map(order.index) if s.name == by[0] else s,
                              kind="stable")
            .reset_index(drop=True)[[*by, "width", "mean", "std", "seeds", "diverged"]])


def mean_std_labels(table: pd.DataFrame, digits: int = 4) -> list[str]:
    """``"mean ± std"`` strings of a table with ``mean`` and ``std`` columns (just the mean when std is NaN)."""
    return [f"{m:.{digits}f} ± {s:.{digits}f}" if s == s else f"{m:.{digits}f}" for m, s in zip(table["mean"],
                                                                                             table["std"])]


def width_costs(model: str, widths: Sequence[float], *, dataset: str = "fmnist", width: float = 1.0,
                num_classes: int = 10, composed: bool = False, **composition) -> pd.DataFrame:
    """Parameters and training FLOPs of one sample, for the p-width model of every ``p`` in ``widths``.

    ``composed=False``: the dense p-width slice (what HeteroFL / FjORD / FedRolex train); ``True``: FLANC's
    composed p-width model (:func:`~subfl.models.composed.build_composed_models`, ``composition`` = its
    ``r1`` / ``r2`` / ``r1_fraction`` / ``r2_fraction``), whose FLOPs include composing ``W_p = V U_p`` in the
    forward pass and its gradient. FLOPs measured with ``FlopCounterMode`` (:func:`~subfl.costs.training_flops`).
    """
    if dataset not in IMAGE_SHAPES:
        raise ValueError(f"dataset={dataset!r} has no input shape here; accepted: {', '.join(IMAGE_SHAPES)}")
    shape = IMAGE_SHAPES[dataset]
    if composed:
        models, _ = build_composed_models(model, widths, num_classes=num_classes, input_shape=shape, width=width,
                                          **composition)
    else:
        if composition:
            raise ValueError(f"composition options {sorted(composition)} need composed=True")
        models = {float(p): build_dense_model(model, num_classes=num_classes, input_shape=shape,
                                              width=model_width(width, p)) for p in widths}
    example = torch.zeros(1, *shape)
    rows = []
    for p, m in sorted(models.items()):
        flops = training_flops(m, example)
        rows.append({"width": p, "parameters": count_parameters(m), "train_flops_per_sample": flops["total"]})
    return pd.DataFrame(rows)


__all__ = ["IMAGE_SHAPES", "client_levels", "finding_status", "mean_std_labels", "ordering_check", "payload_by_level",
           "stage_seconds", "svd_refresh_seconds", "width_costs", "width_table"]


def finding_status(holds: bool, *values: float) -> str:
    """The status of a paper's finding checked on our numbers: ``"same"`` when it holds, ``"differs"`` when it
    does not, ``"differs (diverged)"`` when one of the compared ``values`` is NaN (the runs diverged)."""
    if any(v != v for v in values):
        return "differs (diverged)"
    return "same" if holds else "differs"


def ordering_check(results: Iterable[RunResult], *, method: str = "flanc", rivals: Sequence[str] = ("heterofl", "fjord"),
                   metric: str = "accuracy", higher_is_better: bool = True,
                   groups: Sequence[str] = ("0.25", "0.5", "0.75", "1")) -> pd.DataFrame:
    """Is ``method`` ahead of every one of ``rivals`` at each width? One row per width all of them evaluated.

    ``margin`` is ``method``'s mean minus the best rival's (sign flipped when lower is better, e.g. perplexity,
    so a positive margin always means ``method`` is ahead); ``spread`` is the largest
    ``sqrt(sd_method² + sd_rival²)`` over the rivals (0 with one seed). ``status``: ``"ahead"`` when
    margin > spread, ``"behind"`` when margin < −spread, else ``"within seed spread"``; ``best`` is the best
    method among all runs at that width.
    """
    table = width_table(results, groups=groups, metric=metric)
    missing = {method, *rivals} - set(table["method"])
    if missing:
        raise ValueError(f"no runs of {sorted(missing)} in results; methods present: {sorted(set(table['method']))}")
    sign = 1.0 if higher_is_better else -1.0
    rows = []
    for width, sub in table.groupby("width"):
        if not {method, *rivals} <= set(sub["method"]):
            continue  # a width only some methods evaluate (e.g. FLANC's ½ in a two-device-type run)
        mean = dict(zip(sub["method"], sub["mean"]))
        sd = dict(zip(sub["method"], sub["std"].fillna(0.0)))
        margin = min(sign * (mean[method] - mean[r]) for r in rivals)
        spread = max((sd[method] ** 2 + sd[r] ** 2) ** 0.5 for r in rivals)
        status = "ahead" if margin > spread else "behind" if margin < -spread else "within seed spread"
        best = (max if higher_is_better else min)(mean, key=mean.get)
        rows.append({"width": width, "best": best, "margin": margin, "spread": spread, "status": status})
    return pd.DataFrame(rows, columns=["width", "best", "margin", "spread", "status"])


def stage_seconds(results: Iterable[RunResult], by: Sequence[str] = ("method",)) -> pd.DataFrame:
    """Mean wall-clock seconds per round of every engine stage (``timings.csv``: ``configure``, ``local_train``,
    ``aggregate``, ``evaluate``), one row per ``by`` group, averaged over the rounds of all its runs.

    ``local_train`` is the sum over the round's clients (they train one after another in the simulation);
    ``local_per_client`` divides it by the clients per round; ``server_share`` is
    (configure + aggregate) / local_train and ``server_share_per_client`` the same against one client's training
    (clients training in parallel, as in a deployment). ``evaluate`` is averaged over the rounds that evaluated.
    Diverged runs are left out (their last round has no aggregation)."""
    frames = []
    for r in results:
        if r.diverged:
            continue
        t = r.timings.groupby("stage")["seconds"].mean()
        frames.append({**{b: getattr(r.config, b) for b in by}, **t.to_dict(),
                       "clients_per_round": r.config.clients_per_round, "torch_threads": r.summary.get(
                           "torch_threads")})
    if not frames:
        raise ValueError("no finished (non-diverged) run among results")
    table = pd.DataFrame(frames).groupby(list(by), sort=False).mean(numeric_only=True).reset_index()
    for stage in ("configure", "aggregate", "evaluate"):
        if stage not in table:
            table[stage] = 0.0
    table["local_per_client"] = table["local_train"] / table["clients_per_round"]
    server = table["configure"] + table["aggregate"]
    table["server_share"] = server / table["local_train"]
    table["server_share_per_client"] = server / table["local_per_client"]
    return table[[*by, "configure", "aggregate", "local_train", "local_per_client", "evaluate", "server_share",
                  "server_share_per_client", "torch_threads"]]


def svd_refresh_seconds(model: torch.nn.Module, repeats: int = 3) -> pd.DataFrame:
    """Wall-clock seconds of the spectral methods' orthogonal-space refresh — the thin float64 SVD
    (:func:`~subfl.models.factorized.svd_factors`) — of every decomposed layer of ``model``: the median of
    ``repeats`` calls per layer, with the layer's ``(n, m)`` matrix shape. A measurement for the runtime page,
    not a benchmark (use ``benchmarks/bench_spectral_server.py`` for that)."""
    import statistics
    import time

    from ..models.factorized import layer_specs, svd_factors
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    rows = []
    for name, spec in layer_specs(model).items():
        matrix = model.get_submodule(name).weight.detach().reshape(spec.out_features, spec.in_features)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            svd_factors(matrix)
            times.append(time.perf_counter() - start)
        rows.append({"layer": name, "shape": f"{spec.out_features} × {spec.in_features}",
                     "seconds": statistics.median(times)})
    return pd.DataFrame(rows, columns=["layer", "shape", "seconds"])


def upload_savings(results: Iterable[RunResult], *, reference: str = "fedavg", by: Sequence[str] = ("method",),
                   model: torch.nn.Module | None = None) -> pd.DataFrame:
    """What one client uploads in one round, by group of runs, and the saving against the ``reference`` method.

    Read from every run's ledger: the tensor rows sent up (the JSON ``__config__`` row left out), summed per
    (round, client). One row per ``by`` group (``by`` must name ``"method"``), in the order the runs come in:

    * ``client_rounds`` — the (round, client) uploads seen in the group's runs;
    * ``bytes_up`` — their mean bytes; ``saving_bytes`` = 1 − bytes_up / bytes_up of the ``reference`` group with the
      same values of the other ``by`` fields (FedAvg uploads the whole model, so this is what a device saves);
    * with ``model`` (the runs' network): ``layers_up`` — the mean number of layers uploaded, a layer being a unit of
      :func:`subfl.methods.fedp3.layer_units` (read with :func:`subfl.costs.layer_subsets.upload_audit`), and
      ``saving_layers`` likewise — the way FedP3 counts its savings (LowerB / OPU2 / OPU3: 60 / 40 / 20 % of a
      five-layer CNN).

    Raises ``ValueError`` when ``by`` lacks ``"method"`` or a group has no ``reference`` runs to compare with.
    """
    by, results = list(by), list(results)
    if "method" not in by:
        raise ValueError(f"by must name 'method' (the reference is a method), got by={by!r}")
    if not results:
        raise ValueError("results is empty: no run to read uploads from")
    if model is not None:
        from ..costs.layer_subsets import upload_audit
    rows = []
    for r in results:
        ledger = r.ledger
        up = ledger[(ledger.direction == "up") & (ledger.name != "__config__")]
        per = up.groupby(["round", "client"])["bytes"].sum()
        row = {**{b: getattr(r.config, b) for b in by}, "client_rounds": len(per), "bytes_total": float(per.sum())}
        if model is not None:
            row["layers_total"] = float(upload_audit(ledger, model).units_up.map(len).sum())
        rows.append(row)
    frame = pd.DataFrame(rows)
    sums = ["client_rounds", "bytes_total"] + (["layers_total"] if model is not None else [])
    table = frame.groupby(by, sort=False)[sums].sum().reset_index()
    table["bytes_up"] = table["bytes_total"] / table["client_rounds"]
    if model is not None:
        table["layers_up"] = table["layers_total"] / table["client_rounds"]
    others = [b for b in by if b != "method"]
    ref = table[table["method"] == reference]
    columns = ["bytes_up"] + (["layers_up"] if model is not None else [])
    keyed = ref[others + columns].rename(columns={c: f"{c}_reference" for c in columns})
    table = table.merge(keyed, on=others, how="left") if others else table.assign(
        **{f"{c}_reference": (ref[c].iloc[0] if len(ref) else float("nan")) for c in columns})
    missing = table[table["bytes_up_reference"].isna()]
    if len(missing):
        raise ValueError(f"no {reference!r} runs to compare with for the group(s) "
                         f"{missing[by].to_dict('records')}; reference={reference!r} must be among the methods")
    table["saving_bytes"] = 1.0 - table["bytes_up"] / table["bytes_up_reference"]
    out = [*by, "client_rounds", "bytes_up", "saving_bytes"]
    if model is not None:
        table["saving_layers"] = 1.0 - table["layers_up"] / table["layers_up_reference"]
        out += ["layers_up", "saving_layers"]
    return table[out]


__all__ += ["upload_savings"]
