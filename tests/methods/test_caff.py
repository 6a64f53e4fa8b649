"""CAFF (subfl.methods.caff): Eqs. (2)-(5) on hand-made tables, the method in the engine, its ledger; and the
pieces it is fed with — the SentencePiece tokenizer (subfl.data.tokenizer) and pretraining
(subfl.pretraining) — at their smallest sizes."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from subfl.costs.finetuning import resource_table
from subfl.data.base import ArrayData, FederatedDataset, TokenWindows
from subfl.fl.engine import EngineSettings, run_simulation
from subfl.fl.profiles import Heterogeneity
from subfl.fl.training import LocalTraining
from subfl.fl.types import ClientProfile, Update
from subfl.fl.method import ServerContext
from subfl.methods.caff import (CAFF, DeviceBudget, binding_constraints, feasible_architectures, freeze_rows,
                                layerwise_average, select_architecture, trainable_layers)
from subfl.models.transformers import TinyGPT


def data_root():
    """The data root the library uses (``SUBFL_DATA_ROOT`` or the default); tests needing a missing file skip."""
    from subfl.data import default_data_root

    return default_data_root()




# ----- Eqs. (2)-(3) on a hand-made resource table -------------------------------------------------------------
def hand_table() -> list[dict]:
    """F_3^t: memory 6 + 4t MB, upload t MB, t GFLOPs; F_6^t: memory 8 + 4t MB, upload t MB, t + 1 GFLOPs."""
    rows = [dict(layers=3, scheme="freeze", trained=t, memory_mb=6 + 4 * t, upload_mb=t, gflops=t) for t in (1, 2, 3)]
    rows += [dict(layers=6, scheme="freeze", trained=t, memory_mb=8 + 4 * t, upload_mb=t, gflops=t + 1)
             for t in range(1, 7)]
    rows.append(dict(layers=3, scheme="lora", trained=3, memory_mb=0.1, upload_mb=0.1, gflops=0.1))  # ignored
    return rows


def test_trainable_layers_is_the_largest_t_within_all_budgets():
    table = hand_table()
    assert trainable_layers(table, 3, DeviceBudget("a", memory_mb=15)) == 2    # 14 <= 15 < 18
    assert trainable_layers(table, 6, DeviceBudget("a", memory_mb=15)) == 1    # 12 <= 15 < 16
    assert trainable_layers(table, 6, DeviceBudget("b", upload_mb=4.5)) == 4
    assert trainable_layers(table, 6, DeviceBudget("c", gflops=3)) == 2        # t + 1 <= 3
    assert trainable_layers(table, 6, {"device": "d"}) == 6                    # unconstrained
    assert trainable_layers(table, 3, DeviceBudget("e", memory_mb=9)) == 0     # the LoRA row does not count
    assert trainable_layers(table, 3, ClientProfile(7, memory_mb=14, upload_mb=5, gflops=5)) == 2


def test_selection_maximises_the_mean_trained_layers():
    devices = [DeviceBudget("weak", memory_mb=15), DeviceBudget("strong")]
    assert feasible_architectures(hand_table(), devices) == [3, 6]
    selection = select_architecture(hand_table(), devices)
    # F_3: (2 + 3) / 2 = 2.5;  F_6: (1 + 6) / 2 = 3.5  ->  F_6
    assert selection.candidates == {3: 2.5, 6: 3.5}
    assert selection.layers == 6 and selection.trained == {"weak": 1, "strong": 6} and selection.mean_trained == 3.5


def test_ties_go_to_the_deeper_model():
    devices = [DeviceBudget(0, upload_mb=2), DeviceBudget(1, upload_mb=2.5)]
    selection = select_architecture(hand_table(), devices)
    assert selection.candidates == {3: 2.0, 6: 2.0} and selection.layers == 6


def test_eq2_drops_architectures_a_device_cannot_train():
    devices = [DeviceBudget("small", memory_mb=11), DeviceBudget("big")]
    assert feasible_architectures(hand_table(), devices) == [3]     # F_6^1 needs 12 MB
    selection = select_architecture(hand_table(), devices)
    assert selection.layers == 3 and selection.trained == {"small": 1, "big": 3}


def test_infeasible_setting_names_the_binding_constraint_and_device():
    devices = [DeviceBudget("ok"), DeviceBudget("slow", gflops=0.5), DeviceBudget("tiny", memory_mb=5, upload_mb=0.5)]
    assert feasible_architectures(hand_table(), devices) == []
    with pytest.raises(ValueError, match="Eq. 2") as err:
        select_architecture(hand_table(), devices)
    message = str(err.value)
    assert "device slow exceeds compute (needs 1 GFLOPs for t=1, has 0.5 GFLOPs)" in message
    assert "device tiny exceeds memory (needs 10 MB for t=1, has 5 MB) and upload" in message
    assert "F_3" in message and "F_6" in message
    assert binding_constraints(hand_table(), 6, DeviceBudget("x", memory_mb=1)).startswith("memory (needs 12 MB")
    with pytest.raises(ValueError, match="F_6: device small exceeds memory"):
        select_architecture(hand_table(), [DeviceBudget("small", memory_mb=11)], layers=6)


def test_freeze_rows_checks_columns():
    with pytest.raises(ValueError, match="lacks column"):
        freeze_rows([dict(layers=3, trained=1, memory_mb=1)])


# ----- Eqs. (4)-(5) ---------------------------------------------------------------------------------------------
def test_layerwise_weighted_average_by_hand():
    weights = {"emb": torch.tensor([1.0]), "blocks.0.w": torch.tensor([0.0]), "blocks.1.w": torch.tensor([0.0]),
               "head": torch.tensor([0.0])}
    updates = [({"blocks.0.w": torch.tensor([4.0]), "blocks.1.w": torch.tensor([2.0]), "head": torch.tensor([1.0])}, 1),
               ({"blocks.1.w": torch.tensor([6.0]), "head": torch.tensor([5.0])}, 3)]
    out = layerwise_average(weights, updates)
    assert out["emb"].item() == 1.0                    # nobody trained it: unchanged
    assert out["blocks.0.w"].item() == 4.0             # only the first device trained it: its value
    assert out["blocks.1.w"].item() == pytest.approx((1 * 2 + 3 * 6) / 4)   # = 5
    assert out["head"].item() == pytest.approx((1 * 1 + 3 * 5) / 4)         # = 4
    method = CAFF(pretrained="none")
    state = {"weights": weights, "layers": 2, "last_round": []}
    new = method.aggregate(state, 1, [Update(0, updates[0][0], 1, {"trained_layers": 2, "group": "1"}),
                                      Update(1, updates[1][0], 3, {"trained_layers": 1, "group": "0.5"})], None)
    assert new["weights"]["blocks.1.w"].item() == pytest.approx(5.0)
    assert method.round_metrics(new, 1) == {("trained_layers", "global"): 1.5, ("architecture_layers", "global"): 2.0,
                                            ("trained_layers", "0.5"): 1.0, ("trained_layers", "1"): 2.0}


# ----- the method in the engine ---------------------------------------------------------------------------------
V, CONTEXT = 32, 8


class Factory:
    """Like the runner's ModelFactory for a tiny GPT: deterministic init, ``layers`` as an option."""

    width = 1.0

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def __call__(self, width=None, layers: int = 3, **overrides):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return TinyGPT(V, num_layers=layers, embed_dim=12, num_heads=3, context_length=CONTEXT)


def _lm_dataset(n_tokens: int = 400) -> FederatedDataset:
    g = torch.Generator().manual_seed(0)
    text = torch.randint(V, (n_tokens,), generator=g)
    train_starts = torch.arange(0, 300, 2)
    test_starts = torch.arange(300, n_tokens - CONTEXT, 4)
    split = lambda s: ArrayData(TokenWindows(text, s, CONTEXT), text[s + CONTEXT])  # noqa: E731
    return FederatedDataset("toy", split(train_starts), split(test_starts), num_classes=V, input_shape=(CONTEXT,),
                            task="next_token", vocab_size=V)


def _ctx(**fields) -> ServerContext:
    training = LocalTraining(optimizer="adamw", lr=1e-2, batch_size=4, local_steps=2)
    return ServerContext(model_fn=Factory(), training=training, rounds=2, seed=0, num_classes=V,
                         input_shape=(CONTEXT,), task="next_token", num_clients=4, **fields)


def _pretrained() -> dict[int, dict[str, torch.Tensor]]:
    return {l: Factory(seed=10 + l)(layers=l).state_dict() for l in (2, 3)}


def _weak_budget(table) -> float:
    rows = freeze_rows(table)
    f3 = rows[rows.layers == 3].set_index("trained").memory_mb
    return float((f3.loc[1] + f3.loc[2]) / 2)   # fits F_3^1 but not F_3^2


def test_caff_in_the_engine_uploads_only_trained_layers():
    ctx = _ctx()
    batch = torch.randint(V, (4, CONTEXT), generator=torch.Generator().manual_seed(0))
    table = resource_table({l: ctx.model_fn(layers=l) for l in (2, 3)}, batch)
    pretrained = _pretrained()
    weak = _weak_budget(table)
    method = CAFF(pretrained=pretrained, budgets={"0.5": {"memory_mb": weak}, "1": {}})
    data = _lm_dataset()
    parts = np.array_split(np.arange(len(data.train)), 4)
    result = run_simulation(method, data, parts, Heterogeneity((0.5, 1.0), (0.5, 0.5)), ctx,
                            EngineSettings(rounds=2, clients_per_round=4, seed=0), progress=False)
    state = result.state
    # Eq. (3) over the four devices: F_2 -> (1 + 1 + 2 + 2) / 4 = 1.5, F_3 -> (1 + 1 + 3 + 3) / 4 = 2
    expected = select_architecture(table, [DeviceBudget(i, memory_mb=weak) for i in range(2)] + [{}, {}])
    assert state["layers"] == expected.layers == 3
    assert state["selection"]["candidates"] == {"2": 1.5, "3": 2.0}
    ledger = result.ledger.to_frame()
    up = ledger[(ledger.direction == "up") & (ledger.name != "__config__")]
    groups = {p.client_id: p.group for p in Heterogeneity((0.5, 1.0), (0.5, 0.5)).profiles(4, 0, 1)}
    for client, rows in up.groupby("client"):
        blocks = {int(n.split(".")[1]) for n in rows.name if n.startswith("blocks.")}
        assert blocks == ({2} if groups[client] == "0.5" else {0, 1, 2})
        assert {"norm.weight", "norm.bias", "head.weight"} <= set(rows.name)
        assert not rows.name.str.contains("embedding").any()       # frozen layers are never uploaded
    down = ledger[(ledger.direction == "down") & (ledger.name != "__config__")]
    assert up.bytes.sum() < down.bytes.sum()
    # embeddings keep their pretrained values; a block only the strong devices train has changed
    final = state["weights"]
    assert torch.equal(final["token_embedding.weight"], pretrained[3]["token_embedding.weight"])
    assert not torch.equal(final["blocks.0.attn.q.weight"], pretrained[3]["blocks.0.attn.q.weight"])
    history = result.history.to_frame()
    trained = history[history.metric == "trained_layers"].set_index(["round", "group"]).value
    assert trained.loc[(1, "global")] == 2.0 and trained.loc[(1, "0.5")] == 1.0 and trained.loc[(1, "1")] == 3.0
    assert (history.metric == "perplexity").any()


def test_caff_takes_weights_from_the_context_and_a_declared_population():
    ctx = _ctx(pretrained=_pretrained(), devices=[{"device": 0, "upload_mb": 1e9}])
    state = CAFF().init(ctx)
    assert state["layers"] == 3 and state["selection"]["population"] == 1   # selected at init
    assert torch.equal(state["weights"]["blocks.1.mlp.fc1.weight"], _pretrained()[3]["blocks.1.mlp.fc1.weight"])
    fixed = CAFF(architecture=2).init(ctx)
    assert fixed["layers"] == 2


def test_caff_errors():
    with pytest.raises(ValueError, match="needs pretrained weights"):
        CAFF().init(_ctx())
    table = hand_table()
    method = CAFF(pretrained={3: Factory()(layers=3).state_dict()}, resource_table=table, layers=[3])
    ctx = _ctx()
    state = method.init(ctx)
    with pytest.raises(ValueError, match="device 1 exceeds memory"):
        method.configure(state, 1, [ClientProfile(0), ClientProfile(1, memory_mb=5)], ctx)
    with pytest.raises(ValueError, match="no entry for group"):
        CAFF(pretrained="none", budgets={"1": {}})._budget(ClientProfile(0, keep_ratio=0.5))
    with pytest.raises(ValueError, match="unknown option"):
        CAFF(rank=3)


# ----- tokenizer and pretraining (smallest sizes) ------------------------------------------------------------------
def _needs(*files):
    root = data_root()
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        pytest.skip(f"data file(s) {missing} not found in {root} (set SUBFL_DATA_ROOT)")
    pytest.importorskip("sentencepiece")


def test_tokenizer_trains_offline_and_is_cached():
    _needs("english_corpus_pd.txt.gz", "shakespeare_by_role.json.gz")
    from subfl.data.tokenizer import TokenizerConfig, shakespeare_tokens, train_tokenizer

    config = TokenizerConfig(vocab_size=400, max_chars=100_000)
    tokenizer = train_tokenizer(config, data_root())
    assert tokenizer.vocab_size == 400 and "tokenizers" in str(tokenizer.path)
    again = train_tokenizer(config, data_root())
    assert again.path == tokenizer.path
    fresh = train_tokenizer(config, data_root(), cache=False)  # deterministic: the same pieces and scores
    assert fresh.path != tokenizer.path
    assert [(fresh.processor.id_to_piece(i), fresh.processor.get_score(i)) for i in range(400)] == \
        [(tokenizer.processor.id_to_piece(i), tokenizer.processor.get_score(i)) for i in range(400)]
    shutil.rmtree(fresh.directory)
    text = "To be, or not to be: that is the question."
    ids = tokenizer.encode(text)
    assert ids.dtype == np.int64 and 0 < len(ids) < len(text) and tokenizer.decode(ids) == text
    assert tokenizer.decode(tokenizer.encode("naïve Ægypt")) == "naïve Ægypt"     # byte fallback: no <unk>
    assert tokenizer.decode(tokenizer.encode("½")) == "1⁄2"                        # NFKC normalisation
    data = shakespeare_tokens(tokenizer, seq_len=64, max_users=5, data_root=data_root())
    assert len(data.group_names) == 5 and data.task == "next_token" and data.vocab_size == 400
    assert set(np.unique(data.train.groups)) == set(range(5)) and data.train.x.shape[1] == 64
    first = data.train.x[0]
    assert torch.equal(data.train.y[:1], data.train.x.text[data.train.x.starts[:1] + 64])
    assert first.shape == (64,)


def test_pretraining_ci_is_cached():
    _needs("english_corpus_pd.txt.gz")
    from subfl.pretraining import pretrain, pretrain_summary, pretrained_dir, preset

    config = preset("lm", "ci", steps=2, tokenizer_max_chars=100_000, vocab_size=400)
    assert pretrain_summary(config) is None
    state = pretrain(config, data_root())
    summary = pretrain_summary(config)
    assert len(summary["train_loss"]) == 2 and summary["eval_perplexity"] > 1
    assert (pretrained_dir(config) / "weights.pt").is_file()
    model = TinyGPT(400, num_layers=3)
    model.load_state_dict(state)
    again = pretrain(config, data_root())
    assert all(torch.equal(state[k], again[k]) for k in state)
    assert preset("lm", "cpu", 6).layers == 6 and preset("vit", "paper").embed_dim == 192


def test_pretraining_waits_for_another_process_training_the_same_model(monkeypatch):
    """Two processes asking for the same missing model train it once: the second waits on the lock (bounded), then
    reads the weights the first one stored."""
    _needs("english_corpus_pd.txt.gz")
    import subfl.pretraining as pretraining
    from subfl.artifacts import artifact_dir
    from subfl.locking import exclusive, lock_file_for

    config = pretraining.preset("lm", "ci", steps=1, tokenizer_max_chars=100_000, vocab_size=400)
    lock = lock_file_for(pretraining.pretrained_dir(config), artifact_dir("locks"))
    monkeypatch.setenv("SUBFL_LOCK_TIMEOUT_S", "0.3")
    with exclusive(lock, "another process's pretraining"):
        with pytest.raises(TimeoutError, match="pretraining lm-l3-"):
            pretraining.pretrain(config, data_root())
    trained = []
    real = pretraining.train_from_scratch
    monkeypatch.setattr(pretraining, "train_from_scratch", lambda *a, **k: trained.append(1) or real(*a, **k))
    first = pretraining.pretrain(config, data_root())
    second = pretraining.pretrain(config, data_root())
    assert len(trained) == 1
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_vit_pipeline_pretrained_on_disjoint_cifar10_classes():
    _needs("cifar10_train.npz", "cifar10_test.npz")
    from subfl.pretraining import (DOWNSTREAM_CLASSES, PRETRAIN_CLASSES, cifar10_classes,
                                               pretrain_summary, preset)
    from subfl.models.transformers import tiny_vit

    assert not set(PRETRAIN_CLASSES) & set(DOWNSTREAM_CLASSES)
    data = cifar10_classes(DOWNSTREAM_CLASSES, data_root(), max_train=40, max_test=10)
    assert data.class_names == ("dog", "frog", "horse", "ship", "truck") and len(data.train) == 40
    assert sorted(np.unique(data.train.labels)) == [0, 1, 2, 3, 4]

    class VitFactory:
        width = 1.0

        def __call__(self, width=None, **options):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                return tiny_vit(5, (3, 32, 32), **options)

    ctx = ServerContext(model_fn=VitFactory(), training=LocalTraining(optimizer="adamw", lr=1e-3, batch_size=8,
                                                                     local_steps=1),
                        rounds=1, seed=0, num_classes=5, input_shape=(3, 32, 32), num_clients=2)
    method = CAFF(pretrained="ci", devices=[{"device": 0, "upload_mb": 2.0}, {"device": 1}])
    result = run_simulation(method, data, [np.arange(0, 40, 2), np.arange(1, 40, 2)], Heterogeneity(), ctx,
                            EngineSettings(rounds=1, clients_per_round=2, seed=0), progress=False)
    assert result.state["layers"] == 3 and pretrain_summary(preset("vit", "ci"))["config"]["classes"] == [0, 1, 2, 3, 4]
    up = result.ledger.to_frame().query("direction == 'up' and name != '__config__'")
    # upload 2 MB: a ViT block is 1.78 MB, so device 0 trains one block; device 1 all three
    assert {n.split(".")[1] for n in up[up.client == 0].name if n.startswith("blocks.")} == {"2"}
    assert {n.split(".")[1] for n in up[up.client == 1].name if n.startswith("blocks.")} == {"0", "1", "2"}
    assert not up.name.str.contains("embedding|cls_token").any()


# ----- option trained_layers: every device trains the same F_l^t (CAFF's Fig. 1) ----------------------------------
def test_fixed_trained_layers_every_device_uploads_exactly_the_last_t_blocks():
    ctx = _ctx()
    method = CAFF(pretrained=_pretrained(), architecture=3, layers=[3], trained_layers=2)
    data = _lm_dataset()
    parts = np.array_split(np.arange(len(data.train)), 4)
    result = run_simulation(method, data, parts, Heterogeneity(), ctx,
                            EngineSettings(rounds=2, clients_per_round=4, seed=0), progress=False)
    ledger = result.ledger.to_frame()
    up = ledger[(ledger.direction == "up") & (ledger.name != "__config__")]
    assert up.groupby(["round", "client"]).ngroups == 8
    for _, rows in up.groupby(["round", "client"]):
        assert {int(n.split(".")[1]) for n in rows.name if n.startswith("blocks.")} == {1, 2}
        assert not rows.name.str.contains("embedding").any()
        # a block of width 12: q, k, v, proj 4 x (144 + 12) + fc1 (576 + 48) + fc2 (576 + 12) + 2 LayerNorms x 24
        # = 1,884; two blocks + the final LayerNorm (24) + the head (32 x 12, no bias) = 4,176 float32 = 16,704 bytes
        assert rows.bytes.sum() == 4 * (2 * 1884 + 24 + 32 * 12) == 16_704
    history = result.history.to_frame()
    assert set(history[history.metric == "trained_layers"].value) == {2.0}
    final = result.state["weights"]
    assert torch.equal(final["blocks.0.attn.q.weight"], _pretrained()[3]["blocks.0.attn.q.weight"])   # frozen
    assert not torch.equal(final["blocks.1.attn.q.weight"], _pretrained()[3]["blocks.1.attn.q.weight"])


def test_fixed_trained_layers_overrides_the_budget_choice_and_checks_budgets():
    table = hand_table()
    ctx = _ctx()
    method = CAFF(pretrained={3: Factory()(layers=3).state_dict()}, resource_table=table, layers=[3], architecture=3,
                  trained_layers=1)
    state = method.init(ctx)
    tasks = method.configure(state, 1, [ClientProfile(0), ClientProfile(1, memory_mb=14)], ctx)
    assert {c: t.config["trained_layers"] for c, t in tasks.items()} == {0: 1, 1: 1}   # budgets alone: 3 and 2
    fixed3 = CAFF(pretrained={3: Factory()(layers=3).state_dict()}, resource_table=table, layers=[3], architecture=3,
                  trained_layers=3)
    with pytest.raises(ValueError, match=r"device 1 cannot train F_3\^3 \(option trained_layers=3\): it exceeds "
                                         r"memory \(needs 18 MB for t=3, has 14 MB\)"):
        fixed3.configure(fixed3.init(ctx), 1, [ClientProfile(0), ClientProfile(1, memory_mb=14)], ctx)


def test_fixed_trained_layers_option_is_checked():
    assert CAFF(pretrained="none", architecture=6, trained_layers=6).config["trained_layers"] == 6
    with pytest.raises(ValueError, match="option trained_layers=2 needs option architecture"):
        CAFF(pretrained="none", trained_layers=2)
    with pytest.raises(ValueError, match=r"option trained_layers=4 exceeds architecture=3: accepted 1..3"):
        CAFF(pretrained="none", architecture=3, trained_layers=4)
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="option trained_layers must be an int >= 1"):
            CAFF(pretrained="none", architecture=3, trained_layers=bad)
