"""The CAFF chapter (Pfeiffer, Ahmed, Khalili & Henkel, "Efficient Federated Finetuning of Tiny Transformers with
Resource-Constrained Devices"): the per-seed values, best-baseline choices, pooled comparisons and plan / cost
checks behind the scorecards of ``notebooks/caff/finetuning.ipynb`` (Fig. 1, Sec. 3.1), ``constraints.ipynb``
(Table 1, Fig. 4), ``heterogeneous.ipynb`` (Table 2, Sec. 4.4, App. B) and ``cifar10.ipynb`` (Table 2 CIFAR-10).

A table *cell* is the key of a run without its method: ``(constraint,)`` for Table 2, ``(constraint, level)`` for
Table 1; ``values`` maps ``(*cell, method)`` to one value per seed (accuracy in percent, a diverged seed NaN).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from operator import itemgetter

import numpy as np
import pandas as pd

from subfl.experiments.config import ExperimentConfig
from subfl.experiments.runner import RunResult
from subfl_book.analysis import group_members
from subfl_book.caff_results import model_name  # noqa: F401  (the pages import it from here too)
from subfl_book.scorecard import seed_percent  # noqa: F401  (the pages import it from here too)

Values = Mapping[tuple, Sequence[float]]
"""Per-seed values of the runs of a table, keyed by ``(*cell, method)``."""

SETTING_COLUMNS = {"caff": ("caff", "trained"), "hetlora": ("hetlora", "rank"), "fedhm": ("fedhm", "rank_ratio"),
                   "depthfl": ("depthfl", "depth"), "heterofl-ft": ("width", "width"), "fjord-ft": ("width", "width"),
                   "fedrolex-ft": ("width", "width")}
"""For each method of Table 2, its table in :func:`~subfl_book.catalog.caff_resource_tables` and the column of the
setting it chooses per group (``t_c``, LoRA rank, rank ratio, depth, width)."""

FinetuningKey = tuple[int, str, int, int]
"""A Fig. 1 configuration: (layers l, scheme "freeze" / "lora", trained blocks t, LoRA rank; 0 for layer finetuning)."""


# --- per-seed values of table cells (Tables 1-2) ---------------------------------------------------------------------

def seed_mean(values: Sequence[float]) -> float:
    """The NaN-skipping mean over seeds (NaN for none): how the best method of a Table 1/2 cell is ranked."""
    return float(np.nanmean(values)) if len(values) else float("nan")


def cell_values(values: Values, *key: Hashable) -> list[float]:
    """The per-seed values of one run of a Table 1/2 cell, ``key`` = (constraint[, level], method); [] if not run."""
    return values.get(tuple(key), [])


def table_cells(constraints: Iterable[str], levels: Mapping[str, Sequence[float]] | None = None) -> list[tuple]:
    """The cells of Table 2 (``(constraint,)``), or of Table 1 with ``levels`` (``(constraint, level)`` per level)."""
    if levels is None:
        return [(c,) for c in constraints]
    return [(c, level) for c in constraints for level in levels[c]]


def run_config(runs: Mapping[tuple, Sequence[RunResult]], key: tuple, default: ExperimentConfig) -> ExperimentConfig:
    """The configuration of the first seed run under ``key`` (the setting a scorecard row cites), else ``default``."""
    return runs[key][0].config if key in runs else default


# --- best baseline and pooled comparisons (Tables 1-2, Sec. 4.4's summary, abstract and conclusion) ----------------

def best_method(values: Values, cell: tuple, among: Iterable[str]) -> str | None:
    """The method of ``among`` with the highest seed mean in ``cell`` (the bold cell of a Table 1/2 column), None if
    none ran."""
    ran = [m for m in among if values.get((*cell, m))]
    return max(ran, key=lambda m: seed_mean(values[(*cell, m)])) if ran else None


def pair_means(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[list[float], list[float]]:
    """Per seed, the mean over compared cells of the first and of the second values ([], [] when nothing compared)."""
    if not pairs:
        return [], []
    return list(np.mean([p[0] for p in pairs], axis=0)), list(np.mean([p[1] for p in pairs], axis=0))


def pooled(values: Values, cells: Iterable[tuple], first: str = "caff", second: str | None = None,
           among: Iterable[str] = ()) -> tuple[list[float], list[float]]:
    """Per seed, ``first``'s values and ``second``'s (default: each cell's best of ``among``) averaged over the cells
    where both ran: the pooled orderings of Tables 1-2 behind the paper's summary claims (Sec. 4.4, abstract)."""
    among = list(among)
    pairs = []
    for cell in cells:
        other = second or best_method(values, cell, among)
        if values.get((*cell, first)) and other and values.get((*cell, other)):
            pairs.append((values[(*cell, first)], values[(*cell, other)]))
    return pair_means(pairs)


def pooled_margin(values: Values, cells: Iterable[tuple], among: Iterable[str], first: str = "caff") -> list[float]:
    """Per seed, ``first``'s lead over each cell's best of ``among``, averaged over the cells (Table 1's caption: CAFF's
    lead is largest under memory)."""
    ahead, behind = pooled(values, cells, first, among=among)
    return [a - b for a, b in zip(ahead, behind)]


def group_split(config: ExperimentConfig, strong_groups: Sequence[str] = ("1",)) -> tuple[float, int]:
    """Sec. 4.4's half-weak / half-strong split: the share (%) of devices in the strong group, and how many of rounds
    2 … R draw a weak / strong assignment different from round 1's."""
    strong = group_members(config, tuple(strong_groups))
    setting = config.heterogeneity_setting
    draws = {p.client_id: p.group for p in setting.profiles(config.num_clients, config.seed, 1)}
    changed = sum(any(p.group != draws[p.client_id] for p in setting.profiles(config.num_clients, config.seed, r))
                  for r in range(2, config.rounds + 1))
    return 100 * len(strong) / config.num_clients, changed


# --- measured costs (Sec. 3.1, Fig. 4, Table 2's plan, App. B) -------------------------------------------------------

def cost_at(table: pd.DataFrame, layers: int, trained: int, column: str) -> float:
    """The measured cost ``column`` of CAFF's F_l^t (``layers`` l, ``trained`` t) in its resource table (Sec. 3.1)."""
    return float(table[(table.layers == layers) & (table.trained == trained)][column].iloc[0])


def cost_kept(table: pd.DataFrame, key: str, high: float, low: float, column: str, layers: int) -> float:
    """The share of cost ``column`` kept when setting ``key`` drops from ``high`` to ``low`` on F_``layers`` (Fig. 4:
    lowering the rank barely moves memory; App. B's width scaling)."""
    rows = table[table.layers == layers].set_index(key)
    return float(rows.loc[low, column] / rows.loc[high, column])


def largest_setting(tables: Mapping[str, pd.DataFrame], method: str, layers: float, constraint: str,
                    budget: float) -> float | None:
    """The largest setting of ``method`` on F_``layers`` whose measured ``constraint`` is within ``budget`` (Eq. 1 for
    CAFF, App. B for the baselines), None when none fits."""
    table, key = SETTING_COLUMNS[method]
    rows = tables[table][(tables[table].layers == layers) & (tables[table][constraint] <= budget)]
    return float(rows[key].max()) if len(rows) else None


def deepest_full_width(tables: Mapping[str, pd.DataFrame], constraint: str, budget: float) -> float | None:
    """The deepest model a device with ``budget`` trains at full width s = 1 (App. B's choice of HeteroFL's model)."""
    return max((l for l in tables["width"].layers.unique()
                if largest_setting(tables, "heterofl-ft", l, constraint, budget) == 1.0), default=None)


def planned_errors(plan: pd.DataFrame, table2: pd.DataFrame, tables: Mapping[str, pd.DataFrame],
                   budgets: Mapping[str, Sequence[float]], method: str, *, strong_dense: bool = False,
                   strong_deepest_full: bool = False) -> int:
    """Table 2 group settings of ``method`` that are not the largest within the group's budget or that a run did not
    choose (Eq. 1, Eqs. 6-7), plus constraints where the strong devices do not train densely (``strong_dense``) or
    not the deepest full-width model (``strong_deepest_full``), as App. B prescribes."""
    errors = 0
    for r in plan[(plan.method == method) & (plan.mark != "—")].itertuples():
        w, s = budgets[r.constraint]
        errors += ((largest_setting(tables, method, r.layers, r.constraint, w) != r.weak)
                   + (largest_setting(tables, method, r.layers, r.constraint, s) != r.strong))
        errors += bool((strong_dense and r.strong != 1.0)
                       or (strong_deepest_full and r.layers != deepest_full_width(tables, r.constraint, s)))
    return errors + sum(v is False for v in table2[table2.method == method]["run chose the planned setting"])


# --- Fig. 1: layer finetuning against LoRA ---------------------------------------------------------------------------

def lora_key(layers: int, rank: int) -> FinetuningKey:
    """The Fig. 1 key of LoRA with ``rank`` on F_``layers`` (every block adapted)."""
    return (int(layers), "lora", int(layers), int(rank))


def layer_key(layers: int, trained: int) -> FinetuningKey:
    """The Fig. 1 key of layer finetuning F_l^t: the last ``trained`` blocks of F_``layers``."""
    return (int(layers), "freeze", int(trained), 0)



def finetuning_name(key: FinetuningKey) -> str:
    """How Fig. 1's scorecard names a configuration: F_l^t, or LoRA r = … on F_l (:func:`model_name`)."""
    return model_name(key[0], key[2]) if key[1] == "freeze" else f"LoRA r = {key[3]} on {model_name(key[0])}"


def most_accurate(keys: Iterable[FinetuningKey],
                  per_seed: Mapping[FinetuningKey, Sequence[float]]) -> FinetuningKey | None:
    """The configuration of ``keys`` with the highest NaN-skipping seed mean (Fig. 1's best LoRA / layer finetuning)."""
    return max(keys, key=lambda k: np.nanmean(per_seed[k]), default=None)


def cheapest(keys: Iterable[FinetuningKey], setting: int) -> FinetuningKey:
    """The cheapest configuration of ``keys`` by the value at index ``setting`` (2: trained blocks t, 3: LoRA rank),
    Fig. 1's cheapest layer finetuning / LoRA."""
    return min(keys, key=itemgetter(setting))


def memory_ratio(per_seed: Mapping[FinetuningKey, Sequence[float]], cost: Mapping[FinetuningKey, Mapping[str, float]],
                 layer_keys: Iterable[FinetuningKey], lora: FinetuningKey, seed: int) -> float:
    """Sec. 4.4's "LoRA needs 2-3x the memory": peak memory of ``lora`` over that of the cheapest layer finetuning at
    least as accurate on seed index ``seed`` (0.0 when none is)."""
    target = per_seed[lora][seed]
    fits = [cost[k]["memory_mb"] for k in layer_keys if per_seed[k][seed] >= target]
    return cost[lora]["memory_mb"] / min(fits) if fits else 0.0


def shallow_deep_pairs(layer_keys: Sequence[FinetuningKey],
                       cost: Mapping[FinetuningKey, Mapping[str, float]]) -> list[tuple[FinetuningKey, FinetuningKey]]:
    """Sec. 3.1 under a compute limit: (shallower model training the most blocks within the FLOPs of the deeper
    configuration, deeper configuration) for every deeper F_l^t that a shallower model beats on trained blocks."""
    pairs = []
    for deep in layer_keys:
        shallower = [k for k in layer_keys if k[0] < deep[0] and cost[k]["mflops"] <= cost[deep]["mflops"]]
        if shallower:
            most = max(shallower, key=lambda k: (k[2], -k[0]))
            if most[2] > deep[2]:
                pairs.append((most, deep))
    return pairs


def table_row(table: pd.DataFrame, kind: str, layers: int, config: str) -> pd.Series:
    """The cost row of one model family, depth and finetuning configuration (``"t = 1"``, ``"LoRA r = 24"``) in the
    memory page's table (CAFF Fig. 5, App. A)."""
    return table[(table.model == kind) & (table.layers == layers) & (table.config == config)].iloc[0]


# --- inference cost against GPT-2 124M (Sec. 1) ----------------------------------------------------------------------

GPT2_124M = dict(vocab_size=50257, num_layers=12, embed_dim=768, num_heads=12, context_length=1024, tie_weights=True)
"""GPT-2 "small" (Radford et al. 2019): 12 blocks of width 768 with 12 heads, a 50,257-token vocabulary, 1,024
positions and the output layer tied to the token embedding — 124,439,808 parameters."""

CAFF_LM = dict(vocab_size=8192, embed_dim=96, num_heads=3, context_length=256)
"""The paper's tiny language models (Sec. 4.1): width 96, 3 heads, SentencePiece vocabulary 8,192, context 256."""


def inference_flops_against_gpt2(depths: Sequence[int] = (3, 6, 9, 12), tokens: int = 256) -> pd.DataFrame:
    """Forward FLOPs of one ``tokens``-long sequence (matrix products, :func:`subfl.costs.forward_flops`) of the
    paper's tiny LMs and of GPT-2 124M, built on PyTorch's meta device (shapes only: no weights are needed or
    allocated). One row per model: ``model``, ``parameters``, ``GFLOPs`` and ``GPT-2 / model`` (how many times
    fewer FLOPs than GPT-2)."""
    import torch

    from subfl.costs import forward_flops
    from subfl.models.transformers import TinyGPT

    rows = []
    with torch.device("meta"):
        batch = torch.zeros(1, tokens, dtype=torch.long)
        for name, spec in [("GPT-2 124M", GPT2_124M), *((f"tiny LM, l = {l}", {**CAFF_LM, "num_layers": l})
                                                       for l in depths)]:
            model = TinyGPT(**spec)
            rows.append({"model": name, "parameters": sum(p.numel() for p in model.parameters()),
                         "GFLOPs": forward_flops(model, batch) / 1e9})
    table = pd.DataFrame(rows)
    table["GPT-2 / model"] = table["GFLOPs"].iloc[0] / table["GFLOPs"]
    return table
