"""Costs: hand-counted parameters, FLOPs, saved-activation bytes, optimiser state and ledger totals."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

from subfl.costs import (
    activation_memory_bytes,
    buffer_bytes,
    bytes_of,
    count_parameters,
    download_bytes,
    forward_flops,
    ledger_totals,
    macs,
    optimizer_state_bytes,
    parameter_bytes,
    saved_tensor_breakdown,
    training_flops,
    training_memory,
    upload_bytes,
)
from subfl.models import build_model


def sum_loss(output: torch.Tensor) -> torch.Tensor:
    return output.sum()  # saves nothing for backward


def small_cnn() -> nn.Sequential:
    """Conv2d(1, 4, 3) on 8x8 → 4x6x6 = 144 features → Linear(144, 10)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 10))


def mlp3() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))


# --- parameters -------------------------------------------------------------------------------------


def test_count_parameters_by_hand():
    model = small_cnn()
    conv, linear = 1 * 4 * 3 * 3 + 4, 144 * 10 + 10
    assert (conv, linear) == (40, 1450)
    assert count_parameters(model) == 1490
    assert parameter_bytes(model) == 1490 * 4
    model[0].requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 1450
    assert parameter_bytes(model, trainable_only=True) == 1450 * 4
    assert count_parameters(model) == 1490


def test_parameter_bytes_uses_each_dtype():
    model = small_cnn()
    model[0].double()
    assert parameter_bytes(model) == 40 * 8 + 1450 * 4
    assert parameter_bytes(small_cnn().half()) == 1490 * 2


def test_shared_parameters_counted_once():
    linear = nn.Linear(4, 4)
    assert count_parameters(nn.Sequential(linear, nn.ReLU(), linear)) == 20


def test_buffers_are_not_parameters():
    bn = nn.BatchNorm2d(8)
    assert count_parameters(bn) == 16
    assert buffer_bytes(bn) == 8 * 4 * 2 + 8  # running mean, running var (float32), batch counter (int64)


def test_model_counts_and_width():
    assert count_parameters(build_model("resnet18", num_classes=10, input_shape=(3, 32, 32))) == 11_173_962
    assert count_parameters(build_model("mlp", num_classes=10, input_shape=(784,), width=0.5)) == 89_610


# --- FLOPs --------------------------------------------------------------------------------------------


def test_linear_flops_by_hand():
    model, x = nn.Linear(10, 5), torch.randn(3, 10)
    # forward: 3·10·5 multiply-adds = 300 FLOPs; backward: grad weight only (the batch needs no gradient)
    assert training_flops(model, x) == {"forward": 300, "backward": 300, "total": 600}
    # with an input that requires grad: grad input + grad weight
    assert training_flops(model, x.clone().requires_grad_()) == {"forward": 300, "backward": 600, "total": 900}
    assert forward_flops(model, x) == 300
    assert macs(300) == 150


def test_two_layer_flops_by_hand():
    flops = training_flops(mlp3(), torch.randn(3, 10), loss_fn=sum_loss)
    assert flops["forward"] == 2 * 3 * (10 * 20 + 20 * 5) == 1800
    # layer 2: grad input + grad weight (2·600); layer 1: grad weight only (1200)
    assert flops["backward"] == 2 * (2 * 3 * 20 * 5) + 2 * 3 * 10 * 20 == 2400


def test_conv_flops_by_hand():
    conv, x = nn.Conv2d(2, 3, kernel_size=3, bias=False), torch.randn(1, 2, 5, 5)
    # 3x3 output positions × 3 output channels × (2·3·3) multiply-adds = 486 MACs
    assert forward_flops(conv, x) == 2 * 486
    assert training_flops(conv, x) == {"forward": 972, "backward": 972, "total": 1944}
    assert training_flops(conv, x.clone().requires_grad_())["backward"] == 2 * 972


def test_resnet18_forward_flops_match_analytic_macs():
    model = build_model("resnet18", num_classes=10, input_shape=(3, 32, 32))
    stem = 32 * 32 * 64 * 3 * 9
    stage1 = 4 * (32 * 32 * 64 * 64 * 9)
    stage2 = 16 * 16 * 128 * 64 * 9 + 3 * (16 * 16 * 128 * 128 * 9) + 16 * 16 * 128 * 64  # with 1x1 projection
    # stages 3 and 4 quarter the positions and quadruple in·out channels: same MACs as stage 2
    total_macs = stem + stage1 + 3 * stage2 + 512 * 10
    assert total_macs == 555_422_720
    assert forward_flops(model, torch.randn(1, 3, 32, 32)) == 2 * total_macs


def test_measurements_are_pure():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(), nn.Linear(144, 10))
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(4, 1, 8, 8)
    rng = torch.get_rng_state()
    training_flops(model, x)
    activation_memory_bytes(model, x)
    training_memory(model, x)
    forward_flops(model, x)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert not any(m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)


# --- activation memory ----------------------------------------------------------------------------------


def test_activation_memory_by_hand():
    model = mlp3()
    # Linear1 saves its input x (4·10 floats) for grad W1; ReLU saves its output r (4·20) for its backward,
    # Linear2 saves the same r for grad W2 (counted once); W1ᵀ, W2ᵀ are parameters; sum() saves nothing.
    assert activation_memory_bytes(model, torch.randn(4, 10), loss_fn=sum_loss) == 4 * (4 * 10 + 4 * 20) == 480
    assert activation_memory_bytes(model, torch.randn(8, 10), loss_fn=sum_loss) == 960
    rows = saved_tensor_breakdown(model, torch.randn(4, 10), loss_fn=sum_loss)
    assert [(r.module, r.shape, r.bytes) for r in rows] == [("0", (4, 10), 160), ("1", (4, 20), 320)]


def test_activation_memory_excludes_parameters():
    model = mlp3()
    rows = saved_tensor_breakdown(model, torch.randn(4, 10), loss_fn=sum_loss)
    parameter_shapes = {tuple(p.shape) for p in model.parameters()} | {(10, 20), (20, 5)}  # incl. transposes
    assert not {r.shape for r in rows} & parameter_shapes
    # a frozen first layer needs neither its input nor (since nothing before needs a gradient) ReLU's output
    model[0].requires_grad_(False)
    assert activation_memory_bytes(model, torch.randn(4, 10), loss_fn=sum_loss) == 4 * 4 * 20  # only Linear2's input


def test_default_loss_adds_cross_entropy_tensors():
    # cross-entropy saves log-softmax (4·5 float32), the int64 targets (4) and the 0-d total weight
    assert activation_memory_bytes(mlp3(), torch.randn(4, 10)) == 480 + 4 * 4 * 5 + 8 * 4 + 4


def test_shared_memory_counted_once():
    class Gram(nn.Module):
        def forward(self, x):
            return x @ x.t()  # mm saves x and its transposed view: one storage, one byte range

    x = torch.randn(4, 10, requires_grad=True)
    assert activation_memory_bytes(Gram(), x, loss_fn=sum_loss) == 160
    # a slice of a larger tensor counts only its own bytes
    big = torch.randn(100, 10)
    assert activation_memory_bytes(nn.Linear(10, 3), big[:4], loss_fn=sum_loss) == 160


def test_batchnorm_saves_input_and_per_channel_statistics():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4))
    rows = saved_tensor_breakdown(model, torch.randn(2, 1, 8, 8), loss_fn=sum_loss)
    # conv input (2·1·8·8), BN input (2·4·6·6), BN's saved mean and inverse std (4 each); running stats excluded
    assert [(r.module, r.shape) for r in rows] == [("0", (2, 1, 8, 8)), ("1", (2, 4, 6, 6)), ("1", (4,)), ("1", (4,))]
    assert sum(r.bytes for r in rows) == 4 * (128 + 288 + 8)


# --- optimiser state and training memory -------------------------------------------------------------


def test_optimizer_state_bytes():
    model = small_cnn()
    assert optimizer_state_bytes(model, "sgd") == 0
    assert optimizer_state_bytes(model, "sgd_momentum") == 5960
    assert optimizer_state_bytes(model, "adam") == optimizer_state_bytes(model, "adamw") == 2 * 5960
    model[0].requires_grad_(False)
    assert optimizer_state_bytes(model, "adam") == 2 * 1450 * 4
    assert optimizer_state_bytes(model, "adam", trainable_only=False) == 2 * 5960
    with pytest.raises(ValueError, match="optimizer='rmsprop'.*'sgd_momentum'"):
        optimizer_state_bytes(model, "rmsprop")


def test_training_memory_components_small_cnn():
    model, x = small_cnn(), torch.randn(2, 1, 8, 8)
    # saved: conv input 2·1·8·8 floats, ReLU output 2·4·6·6 (the flattened view Linear saves is the same memory)
    activations = 4 * (2 * 64 + 2 * 144)
    memory = training_memory(model, x, loss_fn=sum_loss)
    assert memory == {
        "weights": 5960,
        "gradients": 5960,
        "optimizer": 5960,
        "activations": activations,
        "total": 3 * 5960 + activations,
    }
    adam = training_memory(model, x, optimizer="adam", loss_fn=sum_loss)
    assert adam["optimizer"] == 11_920 and adam["total"] == 4 * 5960 + activations
    model[0].requires_grad_(False)
    frozen = training_memory(model, x, optimizer="sgd", loss_fn=sum_loss)
    # a frozen conv saves nothing; ReLU's output is still saved by the trainable Linear
    assert frozen == {"weights": 5960, "gradients": 5800, "optimizer": 0, "activations": 4 * 288, "total": 5960 + 5800 + 1152}


def test_training_memory_counts_buffers_as_weights():
    model = nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.BatchNorm2d(4))
    memory = training_memory(model, torch.randn(2, 1, 8, 8), optimizer="sgd", loss_fn=sum_loss)
    assert memory["weights"] == 4 * (36 + 8) + (4 * 8 + 8)
    assert memory["gradients"] == 4 * 44


# --- communication -----------------------------------------------------------------------------------------


def ledger() -> pd.DataFrame:
    rows = [
        (0, 0, "down", "w", (10, 10), "float32", 400),
        (0, 1, "down", "w", (10, 10), "float32", 400),
        (0, 0, "up", "w", (10, 5), "float32", 200),
        (0, 1, "up", "w", (10, 2), "float32", 80),
        (1, 0, "down", "w", (10, 10), "float32", 400),
        (1, 0, "up", "w", (10, 10), "float16", 200),
    ]
    return pd.DataFrame(rows, columns=["round", "client", "direction", "name", "shape", "dtype", "bytes"])


def test_bytes_of_payload():
    payload = {"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.float16), "c": torch.zeros(2, dtype=torch.int64)}
    assert bytes_of(payload) == 48 + 10 + 16
    assert bytes_of({}) == 0
    with pytest.raises(TypeError, match="'x'"):
        bytes_of({"x": [1, 2]})


def test_ledger_totals():
    totals = ledger_totals(ledger())
    assert list(totals.columns) == ["round", "direction", "bytes"]
    assert totals.values.tolist() == [[0, "down", 800], [0, "up", 280], [1, "down", 400], [1, "up", 200]]
    by_client = ledger_totals(ledger(), by=("client",))
    assert by_client.values.tolist() == [[0, 1200], [1, 480]]
    assert ledger_totals(ledger(), by="direction")["bytes"].tolist() == [1200, 480]
    with pytest.raises(ValueError, match="by='size'"):
        ledger_totals(ledger(), by=("size",))


def test_upload_and_download_bytes():
    book = ledger()
    assert upload_bytes(book) == 480 and download_bytes(book) == 1200
    assert upload_bytes(book, client=0) == 400
    assert upload_bytes(book, round=0) == 280
    assert upload_bytes(book, client=1, round=0) == 80
    assert download_bytes(book, client=1, round=1) == 0
    assert upload_bytes(book.iloc[:0]) == 0
    with pytest.raises(ValueError, match="'direction'"):
        upload_bytes(book.drop(columns="direction"))
