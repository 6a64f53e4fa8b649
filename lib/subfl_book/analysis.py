"""Reading finished runs by client capacity: who had which keep ratio, what each width sent, what it cost.

The engine's ledger records tensors per (round, client, direction) but not the client's keep ratio; that is a
pure function of the run's configuration (:meth:`~subfl.fl.profiles.Heterogeneity.profiles`), recomputed here
exactly as the engine draws it, so per-width traffic is measured from the ledger, not assumed.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pandas as pd
import torch

from subfl.costs import count_parameters, training_flops
from subfl.methods.width import model_width
from subfl.models.composed import build_composed_models, build_dense_model
from subfl.experiments.config import ExperimentConfig
from subfl.experiments.runner import RunResult, final_table

from .verdict import MIN_SEEDS, Band, judge_bound, seed_ordering

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


def bar_status(values: Sequence[float], bar: float | None, *, scale: str) -> str:
    """The book's own bar for a full-model reference (e.g. FedAvg ≥ 0.60 on CIFAR-10 at the cpu scale), judged by
    the verdict rule's bound (:func:`subfl_book.verdict.judge_bound`, at least ``bar``) on the per-seed ``values``:
    ``"meets the bar"`` when the whole mean ± sd band is at or above it, ``"below the bar"`` when the whole band is
    below it, else ``"inconclusive (<the rule's reason>)"`` (fewer than three seeds, the band straddles the bar, a
    scale too small to decide). ``"—"`` where there is no bar (``bar`` None)."""
    if bar is None:
        return "—"
    verdict = judge_bound(bar, Band.of(values), at_most=False, scale=scale)
    words = {"same": "meets the bar", "differs": "below the bar"}
    return words.get(verdict.status, f"{verdict.status} ({verdict.reason})")


def ordering_check(results: Iterable[RunResult], *, method: str = "flanc", rivals: Sequence[str] = ("heterofl", "fjord"),
                   metric: str = "accuracy", higher_is_better: bool = True,
                   groups: Sequence[str] = ("0.25", "0.5", "0.75", "1")) -> pd.DataFrame:
    """Is ``method`` ahead of every one of ``rivals`` at each width? One row per width all of them evaluated.

    ``margin`` is ``method``'s mean minus the best rival's (sign flipped when lower is better, e.g. perplexity,
    so a positive margin always means ``method`` is ahead); ``spread`` is ``sd_method + sd_best_rival``, the
    margin the verdict rule's bands must exceed to be apart. ``status`` applies
    :func:`~subfl_book.verdict.seed_ordering` to ``method`` and each rival: ``"ahead"`` when it is ahead of every
    rival, ``"behind"`` when some rival is ahead of it, ``"diverged"`` / ``"inconclusive (n < 3)"`` when a compared
    run diverged / has fewer than three seeds, else ``"within seed spread"``; ``best`` is the best method among the
    runs that did not diverge.
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
        summary = {m: (mean, 0.0 if sd != sd else sd, n) for m, mean, sd, n in
                   zip(sub["method"], sub["mean"], sub["std"], sub["seeds"])}
        margin = min(sign * (summary[method][0] - summary[r][0]) for r in rivals)
        strongest = max(rivals, key=lambda r: sign * summary[r][0])
        spread = summary[method][1] + summary[strongest][1]
        orders = {seed_ordering(summary[method], summary[r], higher_is_better=higher_is_better) for r in rivals}
        status = next((o for o in ("diverged", f"inconclusive (n < {MIN_SEEDS})", "behind") if o in orders),
                      "ahead" if orders == {"ahead"} else "within seed spread")
        finite = {m: v[0] for m, v in summary.items() if v[0] == v[0]}
        best = (max if higher_is_better else min)(finite, key=finite.get) if finite else None
        rows.append({"width": width, "best": best, "margin": margin, "spread": spread, "status": status})
    return pd.DataFrame(rows, columns=["width", "best", "margin", "spread", "status"])


def curve_summary(results: Iterable[RunResult], *, late_rounds: int = 5) -> pd.DataFrame:
    """One row per run: its seed, its final and its best global test accuracy, the round of the best one, and its
    mean local training loss (``train_loss``) over its last ``late_rounds`` rounds. A run whose curve peaks early
    and ends lower, or whose clients fit their data worse late in training, shows here. A diverged run has NaN
    final accuracy and late loss."""
    if late_rounds < 1:
        raise ValueError(f"late_rounds={late_rounds} is not valid; accepted: an integer of at least 1")
    rows = []
    for r in results:
        accuracy = r.curve("accuracy")
        if accuracy.empty:
            raise ValueError(f"the run of seed {r.config.seed} ({r.config.method}) recorded no global accuracy")
        best = accuracy.loc[accuracy.value.idxmax()]
        loss = r.curve("train_loss")
        late = loss[loss["round"] > loss["round"].max() - late_rounds].value.mean() if len(loss) else float("nan")
        rows.append({"seed": r.config.seed, "final": r.final("accuracy"), "best": float(best.value),
                     "best round": int(best["round"]), f"train loss, last {late_rounds} rounds":
                     float("nan") if r.diverged else float(late)})
    return pd.DataFrame(rows)


def stage_seconds(results: Iterable[RunResult], by: Sequence[str] = ("method",)) -> pd.DataFrame:
    """Mean wall-clock seconds per round of every engine stage (``timings.csv``: ``configure``, ``local_train``,
    ``aggregate``, ``evaluate``), one row per ``by`` group, averaged over the rounds of all its runs.

    ``local_train`` is the sum over the round's clients (they train one after another in the simulation);
    ``local_per_client`` divides it by the clients per round; ``server_share`` is
    (configure + aggregate) / local_train and ``server_share_per_client`` the same against one client's training
    (clients training in parallel, as in a deployment). ``evaluate`` is averaged over the rounds that evaluated.
    A part of a stage that the method timed on the engine's clock (``ServerContext.timed``; the spectral methods'
    ``aggregate/svd_refresh``) is a column of its own after those, averaged over the rounds that have it, and
    missing for runs whose method has no such part. Diverged runs are left out (their last round has no
    aggregation)."""
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
    table = with_server_shares(table)
    parts = sorted(c for c in table.columns if isinstance(c, str) and "/" in c)
    return table[[*by, "configure", "aggregate", "local_train", "local_per_client", "evaluate", "server_share",
                  "server_share_per_client", *parts, "torch_threads"]]


def with_server_shares(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (seconds per round in columns ``configure``, ``aggregate``, ``local_train`` and the
    ``clients_per_round``) with ``local_per_client`` = local_train / clients_per_round, ``server_share`` =
    (configure + aggregate) / local_train and ``server_share_per_client`` = the same against one client's
    training (clients training in parallel, as in a deployment)."""
    table = table.copy()
    table["local_per_client"] = table["local_train"] / table["clients_per_round"]
    server = table["configure"] + table["aggregate"]
    table["server_share"] = server / table["local_train"]
    table["server_share_per_client"] = server / table["local_per_client"]
    return table


def _refresh_work(model: torch.nn.Module, repeats: int, svd_solver: str):
    """``(solver, {layer: (shape label, weight matrix)})`` of every decomposed layer of ``model``, ``repeats``
    checked: what :func:`svd_refresh_seconds` times."""
    from subfl.models.factorized import layer_specs
    from subfl.models.spectral_refresh import solver_function

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    factors = solver_function(svd_solver)
    return factors, {name: (f"{spec.out_features} × {spec.in_features}",
                            model.get_submodule(name).weight.detach().reshape(spec.out_features, spec.in_features))
                     for name, spec in layer_specs(model).items()}


def svd_refresh_seconds(model: torch.nn.Module, repeats: int = 3, svd_solver: str = "exact") -> pd.DataFrame:
    """Wall-clock seconds of the spectral methods' orthogonal-space refresh of every decomposed layer of ``model``
    by ``svd_solver`` (:data:`~subfl.models.spectral_refresh.SVD_SOLVERS`: ``"exact"``, the thin float64 SVD of
    :func:`~subfl.models.factorized.svd_factors`; ``"gram"``, the Gram-matrix eigendecomposition): the median of
    ``repeats`` calls per layer, with the layer's ``(n, m)`` matrix shape. A measurement for the runtime pages,
    not a benchmark (use ``benchmarks/bench_spectral_server.py`` / ``bench_svd_refresh.py`` for that).

    Measured with the book's runs' torch thread count (:data:`~subfl_book.store.BOOK_THREADS`), so that it compares
    with their stage timings: on a machine whose cores are busy, a multi-threaded LAPACK call can be ten times
    slower than a one-thread one."""
    from .store import book_threads

    factors, layers = _refresh_work(model, repeats, svd_solver)
    rows = []
    with book_threads():
        for name, (shape, matrix) in layers.items():
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                factors(matrix)
                times.append(time.perf_counter() - start)
            rows.append({"layer": name, "shape": shape, "seconds": statistics.median(times)})
    return pd.DataFrame(rows, columns=["layer", "shape", "seconds"])


def svd_refresh_by_solver(model: torch.nn.Module, solvers: Sequence[str] = ("exact", "gram"), repeats: int = 3
                          ) -> pd.DataFrame:
    """:func:`svd_refresh_seconds` of ``model`` under each of ``solvers``, side by side: one row per decomposed layer
    (``layer``, ``shape``) and a column ``seconds_<solver>`` per solver."""
    if not solvers:
        raise ValueError("solvers must name at least one solver")
    table = None
    for solver in solvers:
        part = svd_refresh_seconds(model, repeats, solver).rename(columns={"seconds": f"seconds_{solver}"})
        table = part if table is None else table.merge(part, on=["layer", "shape"])
    return table


REFRESH_PART = "aggregate/svd_refresh"
"""The part of the aggregate stage the spectral methods time for their refresh; ``<it>/<layer>`` per layer."""


def refresh_layer_seconds(stages: pd.DataFrame, row: Any) -> pd.DataFrame:
    """Where one row of :func:`stage_seconds` spent its SVD refresh: per decomposed layer (the parts
    ``aggregate/svd_refresh/<layer>`` the runs timed), seconds per round and the share of the whole refresh.
    ``row``: the row's label in ``stages``' index (e.g. a method)."""
    prefix = f"{REFRESH_PART}/"
    columns = [c for c in stages.columns if isinstance(c, str) and c.startswith(prefix)]
    if REFRESH_PART not in stages or not columns:
        raise ValueError(f"stages has no {REFRESH_PART!r} parts per layer (runs recorded before the spectral methods "
                         f"timed each layer's refresh, or a method without one)")
    values = stages.loc[row, columns].astype(float)
    if values.isna().all():
        raise ValueError(f"row {row!r} has no {REFRESH_PART!r} parts (its method refreshes nothing)")
    return pd.DataFrame({"layer": [c[len(prefix):] for c in columns], "seconds per round": values.to_numpy(),
                         "share of the refresh": values.to_numpy() / float(stages.loc[row, REFRESH_PART])})


def _client_round_bytes(ledger: pd.DataFrame, direction: str) -> pd.Series:
    """Bytes per (round, client) sent in ``direction`` in one run's ledger, the JSON ``__config__`` row left out."""
    rows = ledger[(ledger.direction == direction) & (ledger.name != "__config__")]
    return rows.groupby(["round", "client"])["bytes"].sum()


def client_round_bytes(results: Iterable[RunResult], direction: str = "down") -> float:
    """Mean bytes one client received (``direction="down"``) or sent (``"up"``) in one round, over every
    (round, client) of ``results``' ledgers; the JSON ``__config__`` row is left out. Under FedP3's global pruning the
    download is the deployed model's size on the wire (kept values plus masks or index lists)."""
    if direction not in ("down", "up"):
        raise ValueError(f"direction={direction!r} is not valid; accepted: down, up")
    totals = [b for r in results for b in _client_round_bytes(r.ledger, direction).tolist()]
    if not totals:
        raise ValueError(f"no {direction!r} traffic in the ledgers of results (empty results or no rounds run)")
    return float(sum(totals) / len(totals))


def upload_savings(results: Iterable[RunResult], *, reference: str = "fedavg", by: Sequence[str] = ("method",),
                   model: torch.nn.Module | None = None) -> pd.DataFrame:
    """What one client uploads in one round, by group of runs, and the saving against the ``reference`` method.

    Read from every run's ledger: the tensor rows sent up (the JSON ``__config__`` row left out), summed per
    (round, client). One row per ``by`` group (``by`` must name ``"method"``), in the order the runs come in:

    * ``client_rounds`` — the (round, client) uploads seen in the group's runs;
    * ``bytes_up`` — their mean bytes; ``saving_bytes`` = 1 − bytes_up / bytes_up of the ``reference`` group with the
      same values of the other ``by`` fields (FedAvg uploads the whole model, so this is what a device saves);
    * with ``model`` (the runs' network): ``layers_up`` — the mean number of layers uploaded, a layer being a unit of
      :func:`subfl.methods.fedp3.layer_units` (read with :func:`subfl.methods.fedp3_costs.upload_audit`), and
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
        from subfl.methods.fedp3_costs import upload_audit
    rows = []
    for r in results:
        ledger = r.ledger
        per = _client_round_bytes(ledger, "up")
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



# ---- CAFF chapter: the fixed finetuning configurations of Fig. 1 ------------------------------------------------
def finetuning_setting(config: ExperimentConfig) -> dict[str, int | str]:
    """The one configuration every device of a run trains, in :func:`subfl.costs.finetuning.resource_table`'s terms:
    ``{"layers": l, "scheme": "freeze", "trained": t, "rank": 0}`` for ``caff`` with method options ``architecture =
    l`` and ``trained_layers = t`` (CAFF's ``F_l^t``); ``{"layers": l, "scheme": "lora", "trained": l, "rank": r}``
    for ``hetlora`` with ``architecture = l`` and one rank, ``ranks = (r,)``. ``ValueError`` for any other run (its
    devices may train different configurations)."""
    options = dict(config.method_options)
    layers = options.get("architecture")
    if config.method == "caff" and layers is not None and options.get("trained_layers") is not None:
        return {"layers": int(layers), "scheme": "freeze", "trained": int(options["trained_layers"]), "rank": 0}
    ranks = options.get("ranks")
    if config.method == "hetlora" and layers is not None and ranks is not None and len(tuple(ranks)) == 1:
        return {"layers": int(layers), "scheme": "lora", "trained": int(layers), "rank": int(tuple(ranks)[0])}
    raise ValueError(f"config is not a fixed finetuning configuration: accepted are method 'caff' with method options "
                     f"architecture and trained_layers, and 'hetlora' with architecture and a single rank in ranks; "
                     f"got method={config.method!r}, method_options={options}")


def _optimizer_state(config: ExperimentConfig) -> str:
    """The optimiser state :func:`subfl.costs.training_memory` counts for ``config``'s optimiser (as the methods do)."""
    if config.optimizer == "sgd":
        return "sgd_momentum" if config.momentum > 0 else "sgd"
    return config.optimizer


def finetuning_costs(configs: Iterable[ExperimentConfig]) -> pd.DataFrame:
    """Measured costs of the configurations ``configs`` train (:func:`finetuning_setting`), one row per distinct
    setting, with :func:`subfl.costs.finetuning.resource_table`'s columns (peak training memory MB, upload MB of the
    trained parameters, GFLOPs per mini-batch). Measured on the runs' own mini-batch — ``batch_size`` windows of the
    dataset option ``seq_len`` tokens (default 256) — for the runs' model (``model``, ``width``, ``model_options``,
    vocabulary = dataset option ``vocab_size``, default 2048) and optimiser state (AdamW: two moments). Costs depend
    on shapes only: no weights or data are loaded. ``ValueError`` when the configs differ in any of these."""
    from subfl.costs.finetuning import TABLE_COLUMNS, example_batch, resource_table
    from subfl.models import build_model

    configs = list(configs)
    if not configs:
        raise ValueError("configs is empty; give at least one fixed finetuning configuration")
    shapes = {(c.batch_size, dict(c.dataset_options).get("seq_len", 256), dict(c.dataset_options).get("vocab_size", 2048),
               _optimizer_state(c), c.model, c.width, c.model_options) for c in configs}
    if len(shapes) > 1:
        raise ValueError(f"configs differ in (batch_size, seq_len, vocab_size, optimizer, model, width, model_options): "
                         f"{sorted(shapes, key=str)}; measure each group separately")
    batch_size, seq_len, vocab, optimizer, model, width, model_options = shapes.pop()
    wanted: dict[int, tuple[set[int], set[int]]] = {}
    for c in configs:
        s = finetuning_setting(c)
        trained, ranks = wanted.setdefault(int(s["layers"]), (set(), set()))
        (trained if s["scheme"] == "freeze" else ranks).add(int(s["trained"] if s["scheme"] == "freeze" else s["rank"]))
    frames = []
    for layers, (trained, ranks) in sorted(wanted.items()):
        net = build_model(model, num_classes=vocab, input_shape=(seq_len,), width=width,
                          **{**dict(model_options), "layers": layers})
        frames.append(resource_table({layers: net}, example_batch(net, batch_size, length=seq_len),
                                     trained_layers=sorted(trained), lora_ranks=sorted(ranks, reverse=True),
                                     optimizer=optimizer))
    return pd.concat(frames, ignore_index=True)[list(TABLE_COLUMNS)]


def finetuning_table(results: Iterable[RunResult], costs: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per fixed finetuning configuration among ``results`` (:func:`finetuning_setting`), in the order the runs
    come: ``layers, scheme, trained, rank``; the measured costs (``costs``: a :func:`finetuning_costs` table, by
    default measured for the runs' configs) as ``memory_mb`` (peak training memory), ``mflops`` (MFLOPs per
    mini-batch) and ``upload_kb`` (kB = 10³ bytes a device sends per round); ``ledger_upload_kb``, the tensor bytes a
    device actually sent per round in the runs' ledgers (mean over client-rounds; equal to ``upload_kb`` when only
    the trained parameters travel); the final ``accuracy`` and ``perplexity`` (mean over seeds, NaN for a diverged
    run), their ``*_std`` (NaN with one seed), ``seeds`` and ``diverged`` (runs)."""
    results = list(results)
    if not results:
        raise ValueError("results is empty")
    keys = ["layers", "scheme", "trained", "rank"]
    rows = []
    for r in results:
        ledger = r.ledger
        up = ledger[(ledger.direction == "up") & (ledger.name != "__config__")]
        rows.append({**finetuning_setting(r.config), "accuracy": r.final("accuracy"),
                     "perplexity": r.final("perplexity"), "diverged": int(r.diverged),
                     "ledger_upload_kb": float(up.groupby(["round", "client"])["bytes"].sum().mean()) / 1e3})
    runs = pd.DataFrame(rows)
    grouped = runs.groupby(keys, sort=False)
    table = grouped[["accuracy", "perplexity", "ledger_upload_kb"]].mean()
    table["accuracy_std"] = grouped["accuracy"].std()
    table["perplexity_std"] = grouped["perplexity"].std()
    table["seeds"] = grouped.size()
    table["diverged"] = grouped["diverged"].sum()
    table = table.reset_index()
    costs = finetuning_costs([r.config for r in results]) if costs is None else costs
    measured = costs[keys].assign(memory_mb=costs["memory_mb"], mflops=costs["gflops"] * 1e3,
                                  upload_kb=costs["upload_mb"] * 1e3)
    table = table.merge(measured, on=keys, how="left", validate="one_to_one")
    missing = table[table["memory_mb"].isna()]
    if len(missing):
        raise ValueError(f"costs has no row for {missing[keys].to_dict(orient='records')}")
    return table[[*keys, "memory_mb", "mflops", "upload_kb", "ledger_upload_kb", "accuracy", "accuracy_std",
                  "perplexity", "perplexity_std", "seeds", "diverged"]]


def best_within_cost(table: pd.DataFrame, cost: str, *, scheme: str = "freeze", rival: str = "lora",
                     metric: str = "accuracy", higher_is_better: bool = True) -> pd.DataFrame:
    """For every ``rival`` configuration of a :func:`finetuning_table`, the best ``scheme`` configuration that costs
    at most as much (column ``cost``, e.g. ``memory_mb``): CAFF's Fig. 1 question "at the same memory / FLOPs /
    upload, which scheme is more accurate?". One row per rival (``layers, rank, cost, metric``) with the best
    ``scheme`` configuration within its cost (``best_layers, best_trained, best_cost, best_metric``; NaN when none is
    that cheap) and ``margin`` = best − rival (sign flipped when lower is better, so a positive margin always means
    ``scheme`` is ahead)."""
    for column in (cost, metric, "scheme", "layers", "trained", "rank"):
        if column not in table.columns:
            raise ValueError(f"table has no column {column!r}; give a finetuning_table (columns "
                             f"{list(table.columns)})")
    mine, theirs = table[table["scheme"] == scheme], table[table["scheme"] == rival]
    if mine.empty or theirs.empty:
        raise ValueError(f"table needs rows of scheme {scheme!r} and of {rival!r}; it has "
                         f"{sorted(set(table['scheme']))}")
    sign = 1.0 if higher_is_better else -1.0
    rows = []
    for _, other in theirs.iterrows():
        within = mine[mine[cost] <= other[cost]]
        row = {"layers": int(other["layers"]), "rank": int(other["rank"]), cost: float(other[cost]),
               metric: float(other[metric]), "best_layers": float("nan"), "best_trained": float("nan"),
               f"best_{cost}": float("nan"), f"best_{metric}": float("nan"), "margin": float("nan")}
        if len(within):
            best = within.loc[(sign * within[metric]).idxmax()]
            row.update({"best_layers": int(best["layers"]), "best_trained": int(best["trained"]),
                        f"best_{cost}": float(best[cost]), f"best_{metric}": float(best[metric]),
                        "margin": sign * (float(best[metric]) - float(other[metric]))})
        rows.append(row)
    return pd.DataFrame(rows)


def pretrained_zero_shot(config: ExperimentConfig, depths: Sequence[int] | None = None,
                         data_root: str | None = None) -> pd.DataFrame:
    """The pretrained models ``F_l``, not finetuned, scored on the test windows a run of ``config`` is scored on
    (:func:`~subfl.experiments.prepare_data`: the same subset) with the engine's evaluation (next-token accuracy and
    cross-entropy at the last position of each window; perplexity = exp(loss)). Weights: the pretraining scale of the
    method option ``pretrained`` (``"ci"``, ``"cpu"``, ``"paper"``), read from the store
    (:func:`subfl_book.store.pretrained`; pretrained and recorded there when missing); ``depths`` default to the config's own (:func:`finetuning_setting`). One row
    per depth: ``layers, accuracy, loss, perplexity``."""
    from subfl.fl.training import evaluate
    from subfl.models.transformers import load_pretrained
    from subfl.pretraining import preset
    from subfl.experiments.runner import ModelFactory, prepare_data

    from .store import pretrained

    source = dict(config.method_options).get("pretrained")
    if source not in ("ci", "cpu", "paper"):
        raise ValueError(f"method option pretrained must be a pretraining scale ('ci', 'cpu', 'paper') to score the "
                         f"pretrained models, got {source!r}")
    depths = [int(finetuning_setting(config)["layers"])] if depths is None else [int(l) for l in depths]
    dataset, test, _ = prepare_data(config, data_root)
    factory = ModelFactory(config, dataset)
    rows = []
    for layers in depths:
        model = factory(layers=layers)
        kind = "lm" if dataset.task == "next_token" else "vit"
        load_pretrained(model, pretrained(preset(kind, source, layers), source, data_root))
        rows.append({"layers": layers, **evaluate(model, test, task=dataset.task)})
    return pd.DataFrame(rows, columns=["layers", "accuracy", "loss", "perplexity"])


def _evaluation_models(result: RunResult, dataset) -> dict[str, torch.nn.Module]:
    from subfl.methods import make_method

    method = make_method(result.config.method, **dict(result.config.method_options))
    from subfl.experiments.runner import server_context

    return method.evaluation_models(result.state(), server_context(result.config, dataset, device="cpu"))


def final_confusions(result: RunResult, data_root: str | None = None, *, prepared=None) -> dict[str, "np.ndarray"]:
    """``{model name: confusion matrix}`` (true class × predicted class) of each evaluation model of a finished run
    on its test set. A stored run that recorded them (:mod:`subfl_book.store`) answers without its weights; otherwise
    the models are rebuilt from the run's final state. ``prepared``: the run's ``prepare_data(config)`` if at hand."""
    from subfl.experiments.runner import prepare_data
    from subfl.metrics.fairness import confusion_matrix, model_predictions

    from .store import StoredRun

    if isinstance(result, StoredRun) and result.confusions is not None:
        return result.confusions
    if result.diverged:
        raise ValueError(f"run {result.config.label()} diverged; its final model is not a result")
    dataset, test, _ = prepare_data(result.config, data_root) if prepared is None else prepared
    out = {}
    for name, model in _evaluation_models(result, dataset).items():
        preds, truth = model_predictions(model, test)
        out[name] = confusion_matrix(preds, truth, dataset.num_classes)
    return out


def final_models(result: RunResult, data_root: str | None = None, *, dataset=None) -> dict[str, torch.nn.Module]:
    """The models a finished run is evaluated with (its method's ``evaluation_models`` of the saved final server
    state, ``{"global": …, group: …}``), rebuilt on the CPU. ``dataset``: the run's ``prepare_data(config)[0]``
    when the caller has it already (else it is loaded). A diverged run raises ``ValueError``."""
    from subfl.experiments.runner import prepare_data

    if result.diverged:
        raise ValueError(f"run {result.config.label()} diverged; its final model is not a result")
    return _evaluation_models(result, prepare_data(result.config, data_root)[0] if dataset is None else dataset)


def group_members(config: ExperimentConfig, groups: Sequence[str]) -> list[int]:
    """The clients whose profile group (the engine's draw of round 1 for ``config.seed``) is in ``groups``;
    ``ValueError`` naming the run's groups when there is none."""
    profiles = config.heterogeneity_setting.profiles(config.num_clients, config.seed, 1)
    wanted = {str(g) for g in groups}
    members = [p.client_id for p in profiles if p.group in wanted]
    if not members:
        raise ValueError(f"no client is in groups {sorted(wanted)}; the run's groups are "
                         f"{sorted({p.group for p in profiles})}")
    return members


def _group_probabilities(config: ExperimentConfig, dataset, train_parts, groups: Sequence[str]) -> "np.ndarray":
    from subfl.metrics.fairness import class_occurrence_probabilities

    members = group_members(config, groups)
    labels = dataset.train.labels
    return class_occurrence_probabilities([labels[train_parts[c]] for c in members], dataset.num_classes)


def group_class_probabilities(config: ExperimentConfig, groups: Sequence[str],
                              data_root: str | None = None) -> "np.ndarray":
    """The class occurrence probabilities of the training samples held by the clients whose profile group is in
    ``groups`` (CAFF §4.4's ``p_k`` of the weak devices when ``groups`` are the weak ones; the engine's own profile
    draw of round 1 and the run's partition, local test sets excluded)."""
    from subfl.experiments.runner import client_splits, prepare_data

    dataset, _, parts = prepare_data(config, data_root)
    return _group_probabilities(config, dataset, client_splits(config, parts)[0], groups)


def weak_device_f1_table(results: Iterable[RunResult], weak_groups: Sequence[str] = ("0.5",),
                         strong_groups: Sequence[str] = ("1",), data_root: str | None = None,
                         model: str | Callable[[RunResult], str] = "global") -> pd.DataFrame:
    """CAFF §4.4 for every finished run: the global model's class-specific F1 on the run's test set, weighted by the
    weak devices' class occurrence probabilities (``weak_f1``, :func:`subfl.metrics.fairness.weak_device_f1`) and,
    for contrast, by the strong devices' (``strong_f1``); ``macro_f1`` (unweighted mean over the classes present in
    the test set) and ``accuracy`` of the same predictions. Diverged runs get NaN. ``model``: which of the run's
    evaluation models (:func:`final_models`) is scored — a key (default ``"global"``) or a function of the run
    returning one."""
    import numpy as np

    from subfl.experiments.runner import client_splits, prepare_data
    from subfl.metrics.fairness import class_f1

    rows = []
    for result in results:
        config = result.config
        row = {"method": config.method, "heterogeneity": config.heterogeneity, "seed": config.seed}
        if result.diverged:
            rows.append({**row, "weak_f1": np.nan, "strong_f1": np.nan, "macro_f1": np.nan, "accuracy": np.nan})
            continue
        prepared = prepare_data(config, data_root)  # once per run: test set and partition
        dataset, _, parts = prepared
        train_parts = client_splits(config, parts)[0]
        confusions = final_confusions(result, data_root, prepared=prepared)
        key = model(result) if callable(model) else model
        if key not in confusions:
            raise ValueError(f"model={key!r} is not an evaluation model of run {config.label()}; accepted: "
                             f"{', '.join(confusions)}")
        matrix = confusions[key]
        f1 = class_f1(matrix)
        present = matrix.sum(axis=1) > 0
        weak = _group_probabilities(config, dataset, train_parts, weak_groups)
        strong = _group_probabilities(config, dataset, train_parts, strong_groups)
        rows.append({**row, "weak_f1": float(weak @ f1), "strong_f1": float(strong @ f1),
                     "macro_f1": float(f1[present].mean()), "accuracy": float(np.trace(matrix) / matrix.sum())})
    return pd.DataFrame(rows)


def recalibrate_batchnorm(model: torch.nn.Module, samples: torch.Tensor, batch_size: int = 256) -> torch.nn.Module:
    """Recompute, in place, every BatchNorm layer's running statistics from its inputs over ``samples``, weights
    unchanged (:func:`torch.optim.swa_utils.update_bn`: one pass in batches of ``batch_size``; each statistic is
    the plain average over the batches of the batch's mean and unbiased variance). Returns ``model`` in eval mode."""
    from torch.optim.swa_utils import update_bn

    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} is not valid; accepted: an integer >= 1")
    if len(samples) == 0:
        raise ValueError("samples is empty; accepted: at least one sample")
    with torch.no_grad():
        update_bn([samples[i:i + batch_size] for i in range(0, len(samples), batch_size)], model)
    return model.eval()


def bn_recalibrated_accuracy(result: RunResult, data_root: str | None = None, *,
                             batch_size: int = 256) -> dict[str, float]:
    """Global test accuracy of a finished run's global model before and after recomputing every BatchNorm layer's
    running statistics on the clients' training samples (the union of their training parts, local test sets
    excluded), weights unchanged: ``{"accuracy": …, "recalibrated_accuracy": …}``.

    A diagnostic, not a method: it tells whether a model fails through its weights or only through stale
    normalisation statistics (for example blocks whose statistics were never aggregated). The statistics are
    recomputed with :func:`torch.optim.swa_utils.update_bn` (a cumulative average over one pass, no
    augmentation). A model without BatchNorm raises ``ValueError``; so does a diverged run.
    """
    import numpy as np

    from subfl.metrics.fairness import model_predictions
    from subfl.experiments.runner import client_splits, prepare_data

    if result.diverged:
        raise ValueError(f"run {result.config.label()} diverged; its final model is not a result")
    config = result.config
    dataset, test, parts = prepare_data(config, data_root)
    model = _evaluation_models(result, dataset)["global"]
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
               for m in model.modules()):
        raise ValueError(f"run {config.label()}: its model has no BatchNorm layer with running statistics")
    preds, truth = model_predictions(model, test)
    before = float((preds == truth).mean())
    indices = torch.as_tensor(np.sort(np.concatenate(client_splits(config, parts)[0])))
    preds, truth = model_predictions(recalibrate_batchnorm(model, dataset.train.x[indices], batch_size), test)
    return {"accuracy": before, "recalibrated_accuracy": float((preds == truth).mean())}


__all__ = ["IMAGE_SHAPES", "best_within_cost", "group_members", "bn_recalibrated_accuracy", "recalibrate_batchnorm", "client_levels", "client_round_bytes", "bar_status", "finetuning_costs",
           "final_confusions", "final_models", "finetuning_setting", "finetuning_table", "group_class_probabilities", "mean_std_labels", "ordering_check", "payload_by_level",
           "pretrained_zero_shot", "refresh_layer_seconds", "stage_seconds", "svd_refresh_by_solver",
           "svd_refresh_seconds", "upload_savings", "with_server_shares",
           "weak_device_f1_table", "width_costs", "width_table"]
