"""The word LSTM classifier (PriSM's IMDB model): sizes, which layers are decomposed, bad arguments (its leading
slice is tested with the character LSTM's, in test_char_rnn.py)."""
import pytest
import torch

from subfl.models import build_model
from subfl.models.char_rnn import GATES
from subfl.models.factorized import decomposable_layers
from subfl.models.sentiment_lstm import SentimentLSTM


def test_parameter_count_by_hand():
    m = SentimentLSTM(2, (128,), vocab_size=10000, width=0.25)
    h, e = 64, 64
    expected = 10000 * e + (e * h + h) + 4 * (h * h + h) + 4 * h * h + (h * 2 + 2)
    assert expected == 677_314 == sum(p.numel() for p in m.parameters())
    assert m(torch.randint(0, 10000, (3, 128))).shape == (3, 2)


def test_gate_maps_are_the_decomposed_layers_and_padding_embeds_to_zero():
    m = build_model("sentiment_lstm", num_classes=2, input_shape=(16,), width=0.125, vocab_size=50)
    assert decomposable_layers(m) == [f"x_gates.{g}" for g in GATES] + [f"h_gates.{g}" for g in GATES]
    assert torch.count_nonzero(m.embedding.weight[0]) == 0
    tokens = torch.randint(0, 50, (4, 16))
    tokens[:, :5] = 0  # left padding, as the imdb loader writes it
    m(tokens).sum().backward()
    assert torch.count_nonzero(m.embedding.weight.grad[0]) == 0  # the padding id's embedding is never trained
    assert torch.count_nonzero(m.embedding.weight.grad[tokens[0, 5]]) > 0


@pytest.mark.parametrize("kwargs, match", [(dict(vocab_size=1), "vocab_size"), (dict(embedding_dim=0), "embedding_dim"),
                                           (dict(num_classes=1), "num_classes"), (dict(norm="bn"), "norm")])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SentimentLSTM(**{"num_classes": 2, "input_shape": (6,), "vocab_size": 20, **kwargs})
