"""The character LSTM: sizes, the LSTM recurrence, and compatibility with width slicing and composition."""
import pytest
import torch

from subfl.models.char_rnn import GATES, CharLSTM
from subfl.models.composed import composable_layers
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


@pytest.mark.parametrize("kwargs, match", [(dict(input_shape=(1, 6)), "input_shape"), (dict(norm="bn"), "norm")])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CharLSTM(20, **{"input_shape": (6,), **kwargs})
    with pytest.raises(ValueError, match="tokens"):
        CharLSTM(20, (6,))(torch.zeros(2, 5, dtype=torch.long))
