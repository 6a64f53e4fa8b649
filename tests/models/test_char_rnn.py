"""The character LSTM: sizes, the LSTM recurrence, and compatibility with width slicing and composition."""
import pytest
import torch

from subfl.models import composed
from subfl.models.char_rnn import GATES, CharLSTM
from subfl.models.composed import compose_model, composable_layers, composition_plan
from subfl.models.sentiment_lstm import SentimentLSTM
from subfl.models.slicing import coverage, extract, leading_indices


def test_parameter_count_by_hand():
    m = CharLSTM(80, (80,))
    h = 256
    expected = 80 * 8 + (8 * h + h) + 4 * (h * h + h) + 4 * h * h + (h * 80 + 80)
    assert expected == 548_816 == sum(p.numel() for p in m.parameters())
    assert CharLSTM(80, (80,), width=0.25).hidden_size == 64


def test_matches_torch_lstm_cell_with_the_same_weights():
    torch.manual_seed(0)
    m = CharLSTM(12, (5,), width=0.0625)  # 16 hidden units
    cell = torch.nn.LSTMCell(16, 16)
    with torch.no_grad():  # torch's gate order: input, forget, cell (g), output
        cell.weight_ih.copy_(torch.cat([m.x_gates[g].weight for g in GATES]))
        cell.bias_ih.copy_(torch.cat([m.x_gates[g].bias for g in GATES]))
        cell.weight_hh.copy_(torch.cat([m.h_gates[g].weight for g in GATES]))
        cell.bias_hh.zero_()
        tokens = torch.randint(0, 12, (3, 5), generator=torch.Generator().manual_seed(1))
        z = m.input_map(m.embedding(tokens))
        h = c = torch.zeros(3, 16)
        for t in range(5):
            h, c = cell(z[:, t], (h, c))
        torch.testing.assert_close(m(tokens), m.classifier(h))


@pytest.mark.parametrize("build", [lambda w: CharLSTM(20, (6,), width=w),
                                   lambda w: SentimentLSTM(2, (6,), width=w, vocab_size=20, embedding_dim=8)],
                         ids=["char_rnn", "sentiment_lstm"])
def test_leading_slice_computes_the_global_model_with_the_rest_zeroed(build):
    full, sub = build(0.125), build(0.0625)
    g = {k: torch.randn_like(v) for k, v in full.state_dict().items()}
    ix = leading_indices(g, sub.state_dict())
    assert ix["embedding.weight"] == (None, None)  # the embedding is never sliced
    masks = coverage(ix, g)
    full.load_state_dict({k: torch.where(masks[k], v, torch.zeros_like(v)) for k, v in g.items()})
    sub.load_state_dict(extract(g, ix))
    tokens = torch.randint(0, 20, (4, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(full(tokens), sub(tokens), rtol=1e-5, atol=1e-5)


def test_composition_keeps_input_map_and_classifier_dense():
    names = composable_layers(CharLSTM(20, (6,), width=0.25), False)
    assert names == [f"x_gates.{g}" for g in GATES] + [f"h_gates.{g}" for g in GATES]


def _composed_lstm(seq_len: int) -> CharLSTM:
    """A width-0.125 (32 units) character LSTM with FLANC's composed gates, random bases and coefficients."""
    torch.manual_seed(0)
    model = CharLSTM(20, (seq_len,), width=0.125)
    plan = composition_plan({1.0: model})
    compose_model(model, {n: (s.r1, s.r2) for n, s in plan.items()})
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


def test_a_composed_gate_is_built_once_per_forward_not_once_per_step(monkeypatch):
    model = _composed_lstm(seq_len=7)
    tokens = torch.randint(0, 20, (3, 7), generator=torch.Generator().manual_seed(4))
    built = []
    compose = composed.compose_weight
    monkeypatch.setattr(composed, "compose_weight", lambda *a, **k: built.append(1) or compose(*a, **k))
    model(tokens)
    assert len(built) == 8  # 4 input-path gates + 4 recurrent gates; per-step building would be 4 + 4 · 7 = 32


def test_building_a_composed_gate_once_computes_what_building_it_every_step_computes():
    model = _composed_lstm(seq_len=6)
    tokens = torch.randint(0, 20, (4, 6), generator=torch.Generator().manual_seed(5))
    out = model(tokens)
    out.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    # the per-step reference: each step calls the composed layer itself, which builds its matrix again
    z = model.input_map(model.embedding(tokens))
    x_parts = {g: model.x_gates[g](z) for g in GATES}
    h = c = torch.zeros(4, model.hidden_size)
    for t in range(6):
        pre = {g: x_parts[g][:, t] + model.h_gates[g](h) for g in GATES}
        c = torch.sigmoid(pre["forget"]) * c + torch.sigmoid(pre["input"]) * torch.tanh(pre["cell"])
        h = torch.sigmoid(pre["output"]) * torch.tanh(c)
    reference = model.classifier(h)
    reference.square().sum().backward()
    assert torch.equal(out, reference)  # the same matrices, so the same logits bit for bit
    for name, p in model.named_parameters():  # the gradients differ only in summation order
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, match", [(dict(input_shape=(1, 6)), "input_shape"), (dict(norm="bn"), "norm")])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CharLSTM(20, **{"input_shape": (6,), **kwargs})
    with pytest.raises(ValueError, match="tokens"):
        CharLSTM(20, (6,))(torch.zeros(2, 5, dtype=torch.long))
