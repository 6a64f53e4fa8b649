import math

import numpy as np
import pytest
import torch
from torch import nn

from subfl.data.base import ArrayData
from subfl.fl import LocalTraining, weighted_average
from subfl.fl.training import ClientDataset, train_epochs


def test_weighted_average_uses_sample_counts():
    a = {"w": torch.tensor([0.0, 3.0]), "n": torch.tensor(2)}
    b = {"w": torch.tensor([4.0, 3.0]), "n": torch.tensor(5)}
    out = weighted_average([a, b], [100, 300])
    assert torch.allclose(out["w"], torch.tensor([3.0, 3.0]))
    assert out["n"].item() == 4 and out["n"].dtype == torch.int64  # 0.25·2 + 0.75·5 = 4.25 → 4


@pytest.mark.parametrize("weights", [[0, 0], [-1, 2]])
def test_weighted_average_rejects_bad_weights(weights):
    with pytest.raises(ValueError, match="weights"):
        weighted_average([{"w": torch.zeros(1)}, {"w": torch.zeros(1)}], weights)


def test_cosine_and_step_schedules():
    cos = LocalTraining(lr=0.1, lr_schedule="cosine", lr_min=0.0)
    assert cos.lr_at(0, 10) == pytest.approx(0.1)
    assert cos.lr_at(5, 10) == pytest.approx(0.05)
    # the last round still learns: 0.05 (1 + cos(0.9 π)) = 0.05 (1 - 0.951057) = 0.0024472
    assert cos.lr_at(9, 10) == pytest.approx(0.0024471742, rel=1e-6)
    assert all(cos.lr_at(t, 10) > cos.lr_at(t + 1, 10) > 0 for t in range(9))
    assert LocalTraining(lr=0.1, lr_schedule="cosine", lr_min=0.01).lr_at(9, 10) == pytest.approx(
        0.01 + 0.045 * (1 - 0.9510565163), rel=1e-6)
    step = LocalTraining(lr=1.0, lr_schedule="step", lr_milestones=(0.5, 0.75), lr_decay=0.1)
    assert [step.lr_at(r, 100) for r in (0, 49, 50, 75)] == pytest.approx([1.0, 1.0, 0.1, 0.01])
    assert math.isclose(cos.round_config(5, 10)["lr"], 0.05)


@pytest.mark.parametrize("kwargs, name", [
    ({"optimizer": "rmsprop"}, "optimizer"), ({"lr": 0}, "lr"), ({"momentum": 1.0}, "momentum"),
    ({"batch_size": 0}, "batch_size"), ({"lr_schedule": "linear"}, "lr_schedule"),
    ({"local_epochs": 0}, "local_epochs"),
])
def test_training_settings_validation(kwargs, name):
    with pytest.raises(ValueError, match=name):
        LocalTraining(**kwargs)


def test_server_context_numbers_rounds_from_one():
    from subfl.fl.method import ServerContext

    ctx = ServerContext(model_fn=lambda: None, training=LocalTraining(lr=0.1, lr_schedule="cosine"), rounds=10,
                        seed=0, num_classes=10, input_shape=(1, 8, 8))
    assert ctx.train_config(1)["lr"] == pytest.approx(0.1)  # first round: full learning rate
    assert ctx.train_config(6)["lr"] == pytest.approx(0.05)  # round 6 is 0-based t = 5 of 10: half way
    assert ctx.train_config(10)["lr"] == pytest.approx(0.0024471742, rel=1e-6)  # the last round still learns
    with pytest.raises(ValueError, match="round"):
        ctx.train_config(0)


def test_default_loss_scores_every_position_of_a_causal_lm():
    import torch
    from torch.nn import functional as F

    from subfl.fl.training import default_loss

    torch.manual_seed(0)
    x = torch.tensor([[1, 2, 3], [4, 5, 6]])
    y = torch.tensor([7, 8])
    logits = torch.randn(2, 3, 9)
    targets = torch.tensor([[2, 3, 7], [5, 6, 8]])  # inputs shifted by one, then the next token
    assert torch.allclose(default_loss(logits, x, y), F.cross_entropy(logits.reshape(6, 9), targets.reshape(6)))
    flat = torch.randn(2, 9)
    assert torch.allclose(default_loss(flat, x, y), F.cross_entropy(flat, y))


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_no_weight_decay_leaves_those_parameters_undecayed(optimizer):
    """One step of a two-layer model with weight decay 0.1: the parameters named in ``no_weight_decay`` move
    exactly as in a run without weight decay, the others exactly as in a run with it."""
    g = torch.Generator().manual_seed(0)
    data = ClientDataset(ArrayData(torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)),
                         np.arange(8))
    start = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)).state_dict()
    config = {"optimizer": optimizer, "lr": 0.1, "momentum": 0.0, "batch_size": 8, "local_steps": 1}
    trained = {}
    for label, wd, skip in (("decayed", 0.1, False), ("plain", 0.0, False), ("split", 0.1, True)):
        model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
        model.load_state_dict(start)
        train_epochs(model, data, {**config, "weight_decay": wd}, torch.Generator().manual_seed(1),
                     no_weight_decay=model[2].parameters() if skip else ())
        trained[label] = model.state_dict()
    for key, value in trained["split"].items():
        reference = trained["plain" if key.startswith("2.") else "decayed"][key]
        assert torch.allclose(value, reference, atol=1e-7), key
    assert not torch.allclose(trained["decayed"]["2.weight"], trained["plain"]["2.weight"], atol=1e-5)
