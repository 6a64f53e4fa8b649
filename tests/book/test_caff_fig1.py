"""CAFF's Fig. 1 in the catalog (caff_fig1_config / caff_fig1_configs) and its analysis helpers
(subfl_book.analysis: finetuning_setting, finetuning_costs, finetuning_table, best_within_cost,
pretrained_zero_shot)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from subfl.experiments import run_experiment
from subfl_book.analysis import (best_within_cost, finetuning_costs, finetuning_setting, finetuning_table,
                                        pretrained_zero_shot)
from subfl_book.catalog import (CAFF_FIG1_LORA_RANKS, CAFF_FIG1_TRAINED, caff_fig1_config, caff_fig1_configs,
                                       caff_fig1_depths)


def _data_root():
    from subfl.data import default_data_root

    return default_data_root()


def _needs_data():
    root = _data_root()
    missing = [f for f in ("english_corpus_pd.txt.gz", "shakespeare_by_role.json.gz") if not (root / f).is_file()]
    if missing:
        pytest.skip(f"data file(s) {missing} not found in {root} (set SUBFL_DATA_ROOT)")
    pytest.importorskip("sentencepiece")


# ----- configurations -----------------------------------------------------------------------------------------------
def test_cpu_configs_carry_the_chapter_sizes_and_one_fixed_configuration_each():
    cfg = caff_fig1_config("layers", 9, 3)
    assert (cfg.method, cfg.dataset, cfg.model, cfg.partition, cfg.width) == (
        "caff", "shakespeare_tokens", "tiny_gpt", "natural", 1.0)
    assert (cfg.num_clients, cfg.clients_per_round, cfg.rounds, cfg.local_steps, cfg.batch_size, cfg.eval_every) == (
        100, 5, 20, 5, 16, 10)
    assert (cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.lr_schedule, cfg.max_test_samples) == (
        "adamw", 3e-4, 0.0, "constant", 2000)
    assert dict(cfg.method_options) == {"pretrained": "cpu", "architecture": 9, "layers": (9,), "trained_layers": 3}
    # the tokenizer of the cpu pretraining preset (vocabulary 2048, the whole corpus)
    assert dict(cfg.dataset_options) == {"seq_len": 64, "stride": 8, "max_users": 100, "min_tokens": 1000,
                                         "vocab_size": 2048, "tokenizer_max_chars": None}
    lora = caff_fig1_config("lora", 6, 24, seed=2)
    assert (lora.method, lora.seed) == ("hetlora", 2)
    assert dict(lora.method_options) == {"pretrained": "cpu", "architecture": 6, "ranks": (24,)}
    assert finetuning_setting(cfg) == {"layers": 9, "scheme": "freeze", "trained": 3, "rank": 0}
    assert finetuning_setting(lora) == {"layers": 6, "scheme": "lora", "trained": 6, "rank": 24}
    ci = caff_fig1_config("layers", 3, 1, scale="ci")
    assert (ci.num_clients, ci.rounds, dict(ci.dataset_options)["vocab_size"],
            dict(ci.dataset_options)["tokenizer_max_chars"], dict(ci.method_options)["pretrained"]) == (
        4, 2, 512, 300_000, "ci")


def test_the_list_of_fig1_runs():
    configs = caff_fig1_configs()
    assert len(configs) == 18 and caff_fig1_depths("cpu") == (3, 6, 9)
    settings = [finetuning_setting(c) for c in configs]
    assert [(s["layers"], s["trained"]) for s in settings if s["scheme"] == "freeze"] == [
        (3, 1), (3, 2), (3, 3), (6, 1), (6, 3), (6, 6), (9, 1), (9, 3), (9, 9)]
    assert [(s["layers"], s["rank"]) for s in settings if s["scheme"] == "lora"] == [
        (l, r) for l in (3, 6, 9) for r in CAFF_FIG1_LORA_RANKS]
    assert len({c.key() for c in configs}) == 18 and {c.seed for c in caff_fig1_configs(seed=1)} == {1}
    assert len(caff_fig1_configs(scale="ci")) == 3
    assert sum(len(ts) + 3 for ts in CAFF_FIG1_TRAINED["paper"].values()) == len(caff_fig1_configs(scale="paper")) == 27


def test_bad_input_names_the_parameter_and_what_is_accepted():
    with pytest.raises(ValueError, match="scheme='freeze' is not valid; accepted: layers, lora"):
        caff_fig1_config("freeze", 3, 1)
    with pytest.raises(ValueError, match="layers=12 is not valid at scale 'cpu'; accepted: 3, 6, 9"):
        caff_fig1_config("layers", 12, 1)
    with pytest.raises(ValueError, match="layers=6 is not valid at scale 'ci'; accepted: 3"):
        caff_fig1_config("lora", 6, 3, scale="ci")
    with pytest.raises(ValueError, match=r"trained_or_rank=4 is not valid for scheme='layers'; accepted: an int in 1..3"):
        caff_fig1_config("layers", 3, 4)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="trained_or_rank=.* is not valid for scheme='lora'; accepted: an int >= 1"):
            caff_fig1_config("lora", 3, bad)
    with pytest.raises(ValueError, match="scale='gpu' is not valid; accepted: ci, cpu, paper"):
        caff_fig1_config("layers", 3, 1, scale="gpu")
    with pytest.raises(ValueError, match="not a fixed finetuning configuration"):
        finetuning_setting(caff_fig1_config("layers", 3, 1).replace(method_options={"pretrained": "cpu"}))


# ----- costs and results ------------------------------------------------------------------------------------------
def test_costs_are_measured_on_the_runs_mini_batch():
    costs = finetuning_costs(caff_fig1_configs(scale="ci")).set_index(["scheme", "trained", "rank"])
    assert len(costs) == 3 and set(costs.layers) == {3}
    # vocabulary 512, width 96: a block has 111,840 parameters (memory page), the final LayerNorm 192, the head 49,152;
    # LoRA r = 3 trains 5,184 adapter weights and 384 LayerNorm weights per block
    assert costs.loc[("freeze", 1, 0), "upload_mb"] * 1e6 == 4 * (111_840 + 192 + 49_152) == 644_736
    assert costs.loc[("freeze", 3, 0), "upload_mb"] * 1e6 == 4 * (3 * 111_840 + 192 + 49_152) == 1_539_456
    assert costs.loc[("lora", 3, 3), "upload_mb"] * 1e6 == 4 * (3 * (5_184 + 384) + 192 + 49_152) == 264_192
    assert costs.loc[("freeze", 1, 0), "memory_mb"] < costs.loc[("freeze", 3, 0), "memory_mb"]
    assert costs.loc[("freeze", 1, 0), "gflops"] < costs.loc[("lora", 3, 3), "gflops"]
    with pytest.raises(ValueError, match="configs differ"):
        finetuning_costs([caff_fig1_config("layers", 3, 1), caff_fig1_config("layers", 3, 1, scale="ci")])


def test_best_within_cost_by_hand():
    table = pd.DataFrame([
        dict(layers=3, scheme="freeze", trained=1, rank=0, memory_mb=60.0, accuracy=0.10),
        dict(layers=9, scheme="freeze", trained=1, rank=0, memory_mb=75.0, accuracy=0.14),
        dict(layers=9, scheme="freeze", trained=9, rank=0, memory_mb=280.0, accuracy=0.16),
        dict(layers=3, scheme="lora", trained=3, rank=3, memory_mb=110.0, accuracy=0.12),
        dict(layers=9, scheme="lora", trained=9, rank=24, memory_mb=300.0, accuracy=0.15),
        dict(layers=3, scheme="lora", trained=3, rank=24, memory_mb=50.0, accuracy=0.11),
    ])
    out = best_within_cost(table, "memory_mb").set_index(["layers", "rank"])
    # LoRA F_3 r=3 at 110 MB: best layer finetuning within 110 MB is F_9^1 (0.14) -> margin +0.02
    assert out.loc[(3, 3), ["best_layers", "best_trained"]].tolist() == [9, 1]
    assert out.loc[(3, 3), "margin"] == pytest.approx(0.02)
    assert out.loc[(9, 24), "best_memory_mb"] == 280.0 and out.loc[(9, 24), "margin"] == pytest.approx(0.01)
    assert math.isnan(out.loc[(3, 24), "margin"])            # nothing as cheap as 50 MB
    ppl = table.assign(perplexity=[10.0, 8.0, 7.0, 9.0, 7.5, 9.5])
    lower = best_within_cost(ppl, "memory_mb", metric="perplexity", higher_is_better=False).set_index(["layers", "rank"])
    assert lower.loc[(3, 3), "best_perplexity"] == 8.0 and lower.loc[(3, 3), "margin"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no column 'mflops'"):
        best_within_cost(table, "mflops")


def test_ci_runs_give_a_table_and_the_zero_shot_row():
    _needs_data()
    configs = caff_fig1_configs(scale="ci")
    results = [run_experiment(c, data_root=_data_root()) for c in configs]
    table = finetuning_table(results)
    assert table[["layers", "scheme", "trained", "rank"]].values.tolist() == [
        [3, "freeze", 1, 0], [3, "freeze", 3, 0], [3, "lora", 3, 3]]
    # the ledger's upload per device and round is exactly the measured upload of the trained parameters
    assert table.ledger_upload_kb.tolist() == pytest.approx(table.upload_kb.tolist(), rel=0, abs=1e-9)
    assert table.upload_kb.tolist() == pytest.approx([644.736, 1539.456, 264.192])
    assert (table.seeds == 1).all() and (table.diverged == 0).all() and table.accuracy.between(0, 1).all()
    assert (table.perplexity > 1).all() and table.accuracy_std.isna().all()
    zero = pretrained_zero_shot(configs[0], data_root=_data_root())
    assert zero.layers.tolist() == [3] and 0 <= zero.accuracy.iloc[0] <= 1
    assert zero.perplexity.iloc[0] == pytest.approx(math.exp(zero.loss.iloc[0]))
    with pytest.raises(ValueError, match="method option pretrained must be a pretraining scale"):
        pretrained_zero_shot(configs[0].replace(method_options={"pretrained": "none", "architecture": 3,
                                                                "trained_layers": 1}))
