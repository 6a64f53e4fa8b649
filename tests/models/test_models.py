"""Models: parameter counts (hand-computed), width rule, norms, shapes and the error table."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from subfl.models import (
    MLP,
    MODELS,
    NORMS,
    VGG11,
    CifarResNet,
    FedAvgCNN,
    ResNet18,
    build_model,
    groupnorm_groups,
    make_norm,
    scaled_channels,
)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def resnet18_params_by_hand(width: float, num_classes: int = 10, in_channels: int = 3) -> int:
    """CIFAR ResNet-18 with BN and bias-free convs: conv k·k·in·out, BN 2·out, projection in·out + 2·out."""
    c = [scaled_channels(b, width) for b in (64, 128, 256, 512)]
    total = 9 * in_channels * c[0] + 2 * c[0]  # stem
    channels = c[0]
    for out in c:
        for block in range(2):
            total += 9 * channels * out + 2 * out + 9 * out * out + 2 * out
            if channels != out:
                total += channels * out + 2 * out
            channels = out
    return total + c[3] * num_classes + num_classes


def test_resnet18_has_the_standard_cifar_parameter_count():
    assert n_params(build_model("resnet18", num_classes=10, input_shape=(3, 32, 32))) == 11_173_962
    assert resnet18_params_by_hand(1.0) == 11_173_962


@pytest.mark.parametrize("width", [0.5, 0.25, 0.125])
def test_resnet18_width_scales_every_channel(width):
    model = ResNet18(10, (3, 32, 32), width=width)
    assert n_params(model) == resnet18_params_by_hand(width)
    assert model.conv1.out_channels == int(64 * width)
    assert model.fc.in_features == int(512 * width)


def test_vgg11_parameter_count():
    convs = [(3, 64), (64, 128), (128, 256), (256, 256), (256, 512), (512, 512), (512, 512), (512, 512)]
    expected = sum(9 * i * o + 2 * o for i, o in convs)  # bias-free convs + BN
    expected += 512 * 512 + 512 + 512 * 10 + 10  # classifier
    assert expected == 9_491_018
    assert n_params(build_model("vgg11", num_classes=10, input_shape=(3, 32, 32))) == expected
    # without norm every conv has a bias instead of BN's 2·out
    plain = build_model("vgg11", num_classes=10, input_shape=(3, 32, 32), norm="none")
    assert n_params(plain) == expected - sum(o for _, o in convs)


def test_fedavg_cnn_parameter_counts():
    # McMahan et al. 2017 CNN on MNIST: 1,663,370 parameters
    mnist = 1 * 32 * 25 + 32 + 32 * 64 * 25 + 64 + 64 * 7 * 7 * 512 + 512 + 512 * 10 + 10
    assert mnist == 1_663_370
    assert n_params(build_model("cnn", num_classes=10, input_shape=(1, 28, 28))) == mnist
    # 8x8 digits: two floor pools give 2x2 → flatten 256
    digits = 832 + 51_264 + 64 * 2 * 2 * 512 + 512 + 5_130
    assert n_params(build_model("cnn", num_classes=10, input_shape=(1, 8, 8))) == digits == 188_810
    half = build_model("cnn", num_classes=10, input_shape=(1, 28, 28), width=0.5)
    assert n_params(half) == (16 * 25 + 16) + (16 * 32 * 25 + 32) + (32 * 49 * 256 + 256) + (256 * 10 + 10)


def test_mlp_parameter_counts():
    assert n_params(build_model("mlp", num_classes=10, input_shape=(1, 28, 28))) == 199_210  # FedAvg 2NN
    half = build_model("mlp", num_classes=10, input_shape=(1, 28, 28), width=0.5)
    assert n_params(half) == 784 * 100 + 100 + 100 * 100 + 100 + 100 * 10 + 10 == 89_610
    custom = build_model("mlp", num_classes=3, input_shape=(64,), hidden=(7,), width=2.0)
    assert n_params(custom) == 64 * 14 + 14 + 14 * 3 + 3
    logistic = MLP(10, (64,), hidden=())
    assert n_params(logistic) == 650


@pytest.mark.parametrize(
    "base, width, expected",
    [(64, 1.0, 64), (64, 0.125, 8), (200, 0.5, 100), (5, 0.5, 3), (3, 0.5, 2), (7, 0.5, 4), (64, 0.001, 1), (10, 2.5, 25)],
)
def test_scaled_channels_rounds_half_up_and_keeps_one(base, width, expected):
    assert scaled_channels(base, width) == expected


@pytest.mark.parametrize("channels, groups", [(64, 32), (512, 32), (8, 8), (48, 16), (6, 2), (7, 1), (1, 1)])
def test_groupnorm_group_rule(channels, groups):
    assert groupnorm_groups(channels) == groups


def test_groupnorm_groups_always_divide():
    assert all(c % groupnorm_groups(c) == 0 for c in range(1, 1025))


def test_make_norm_kinds():
    assert type(make_norm("bn", 8)) is nn.BatchNorm2d
    assert type(make_norm("bn", 8, dims=1)) is nn.BatchNorm1d
    nostats = make_norm("bn_nostats", 8)
    assert not nostats.track_running_stats and nostats.running_mean is None
    gn = make_norm("gn", 48)
    assert isinstance(gn, nn.GroupNorm) and gn.num_groups == 16
    assert isinstance(make_norm("none", 8), nn.Identity)
    # GroupNorm also normalises (N, C) features
    assert make_norm("gn", 6, dims=1)(torch.randn(4, 6)).shape == (4, 6)


INPUTS = {"resnet18": (3, 32, 32), "vgg11": (3, 32, 32), "cnn": (1, 28, 28), "mlp": (1, 28, 28),
          "flanc_cnn": (1, 28, 28), "fedp3_cnn": (3, 32, 32), "fedp3_mlp": (1, 28, 28), "char_rnn": (12,),
          "sentiment_lstm": (12,), "tiny_gpt": (12,), "tiny_vit": (3, 16, 16)}
TOKEN_MODELS = {"char_rnn", "sentiment_lstm", "tiny_gpt"}  # inputs are token ids in [0, num_classes)


@pytest.mark.parametrize("name", MODELS)
def test_every_model_forward_and_backward(name):
    torch.manual_seed(0)
    model = build_model(name, num_classes=7, input_shape=INPUTS[name], width=0.125)
    x = torch.randint(0, 7, (3, *INPUTS[name])) if name in TOKEN_MODELS else torch.randn(3, *INPUTS[name])
    out = model(x)
    if out.dim() == 3:  # a causal LM predicts every position; the datasets' target is the last one
        assert out.shape == (3, INPUTS[name][0], 7)
        out = out[:, -1]
    assert out.shape == (3, 7)
    nn.functional.cross_entropy(out, torch.tensor([0, 1, 2])).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize(
    "name, shape",
    [("resnet18", (1, 28, 28)), ("resnet18", (3, 8, 8)), ("vgg11", (1, 28, 28)), ("vgg11", (1, 8, 8)),
     ("cnn", (1, 8, 8)), ("cnn", (3, 32, 32)), ("mlp", (80,)), ("mlp", (3, 8, 8))],
)
def test_models_accept_other_input_shapes(name, shape):
    model = build_model(name, num_classes=4, input_shape=shape, width=0.125)
    assert model(torch.randn(2, *shape)).shape == (2, 4)


@pytest.mark.parametrize("norm", NORMS)
def test_resnet18_every_norm_kind(norm):
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=10, input_shape=(3, 32, 32), width=0.125, norm=norm)
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    out.sum().backward()
    kinds = {type(m) for m in model.modules()}
    expected = {"bn": nn.BatchNorm2d, "bn_nostats": nn.BatchNorm2d, "gn": nn.GroupNorm}.get(norm)
    if expected is None:
        assert not kinds & {nn.BatchNorm2d, nn.GroupNorm}
        assert all(m.bias is not None for m in model.modules() if isinstance(m, nn.Conv2d))
    else:
        assert expected in kinds
        assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Conv2d))
    if norm == "bn_nostats":
        assert not any(isinstance(m, nn.BatchNorm2d) and m.track_running_stats for m in model.modules())
    model.eval()
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)


@pytest.mark.parametrize("norm", ["bn", "gn", "bn_nostats"])
def test_norm_option_for_vgg_cnn_mlp(norm):
    for name in ("vgg11", "cnn", "mlp"):
        model = build_model(name, num_classes=3, input_shape=INPUTS[name], width=0.125, norm=norm)
        assert any(isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm)) for m in model.modules())
        assert model(torch.randn(2, *INPUTS[name])).shape == (2, 3)


def test_default_norms():
    assert any(isinstance(m, nn.BatchNorm2d) for m in build_model("resnet18", num_classes=2, input_shape=(3, 8, 8)).modules())
    assert any(isinstance(m, nn.BatchNorm2d) for m in build_model("vgg11", num_classes=2, input_shape=(3, 8, 8)).modules())
    for name in ("cnn", "mlp"):
        model = build_model(name, num_classes=2, input_shape=(1, 8, 8))
        assert not any(isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.GroupNorm)) for m in model.modules())


def test_classes_are_importable_and_match_the_registry():
    assert isinstance(build_model("resnet18", num_classes=10, input_shape=(3, 32, 32)), ResNet18)
    assert isinstance(ResNet18(10), CifarResNet)
    assert isinstance(build_model("vgg11", num_classes=10, input_shape=(3, 32, 32)), VGG11)
    assert isinstance(build_model("cnn", num_classes=10, input_shape=(1, 28, 28)), FedAvgCNN)
    assert isinstance(build_model("mlp", num_classes=10, input_shape=(1, 28, 28)), MLP)
    assert MODELS == ("resnet18", "vgg11", "cnn", "mlp", "flanc_cnn", "fedp3_cnn", "fedp3_mlp", "char_rnn",
                      "sentiment_lstm", "tiny_gpt", "tiny_vit")


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(name="resnet50"), ValueError, ["name='resnet50'", "'resnet18'", "'mlp'"]),
        (dict(norm="ln"), ValueError, ["norm='ln'", "'bn'", "'bn_nostats'", "'gn'", "'none'"]),
        (dict(width=0), ValueError, ["width=0"]),
        (dict(width=-0.5), ValueError, ["width=-0.5"]),
        (dict(width=math.inf), ValueError, ["width=inf"]),
        (dict(width=math.nan), ValueError, ["width=nan"]),
        (dict(width="1"), TypeError, ["width", "'1'"]),
        (dict(width=True), TypeError, ["width"]),
        (dict(depth=3), ValueError, ["'depth'", "3", "'resnet18'"]),
        (dict(name="cnn", hidden=(10,)), ValueError, ["'hidden'", "'cnn'"]),
        (dict(name="mlp", blocks=(1,)), ValueError, ["'blocks'", "'hidden'"]),
        (dict(name="mlp", hidden=(0,)), ValueError, ["hidden=(0,)"]),
        (dict(num_classes=0), ValueError, ["num_classes=0"]),
        (dict(input_shape=(32, 32)), ValueError, ["input_shape=(32, 32)"]),
        (dict(name="cnn", input_shape=(1, 3, 3)), ValueError, ["input_shape", "(1, 3, 3)"]),
    ],
)
def test_error_table(kwargs, error, words):
    args = dict(name="resnet18", num_classes=10, input_shape=(3, 32, 32))
    args.update(kwargs)
    name = args.pop("name")
    with pytest.raises(error) as info:
        build_model(name, **args)
    for word in words:
        assert word in str(info.value)


def test_helper_errors():
    with pytest.raises(ValueError, match="norm='batch'"):
        make_norm("batch", 4)
    with pytest.raises(ValueError, match="dims=3"):
        make_norm("bn", 4, dims=3)
    with pytest.raises(ValueError, match="base=0"):
        scaled_channels(0, 1.0)
    with pytest.raises(ValueError, match="width=0"):
        scaled_channels(64, 0.0)
