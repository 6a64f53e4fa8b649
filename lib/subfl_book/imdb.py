"""PriSM's IMDB setting (Fig. 7): sentiment classification with the word LSTM, every client at one keep ratio.

PriSM (Niu et al., TMLR 2023, Fig. 7) reports the accuracy drop of its sub-model methods against the full model on
IMDB reviews with an LSTM: Table 8's model (embedding 1001 → 64, a 2-layer LSTM with hidden 256, FC 256 → 1) and
Table 12's setting (100 clients, SGD from lr 0.1, 300 rounds, κ = 2; iid and α = 0.1 splits). The book departs from
both (:func:`imdb_config`):

* data — :func:`~subfl.data.load_dataset` ``"imdb"``: a class-balanced subset of the 25,000 training reviews and of
  the 25,000 test reviews, each review's **last** ``max_len`` words. The vocabulary is Table 8's at every scale
  (:data:`IMDB_VOCABULARY`: 1001 ids = padding, unknown and the 999 most frequent words of the training subset);
* model — :class:`~subfl.models.sentiment_lstm.SentimentLSTM` (64-d word embedding, the gate maps decomposed);
* training — **Adam** (lr 0.003, gradient norm clipped at 1), one local epoch, the split iid over the clients.
  With PriSM's SGD (momentum 0.9) full-model FedAvg was still at 0.55–0.60 after 10–12 rounds at lr 0.05 and 0.5
  (with 1 or 3 local epochs; measured in pilot runs at the ``cpu`` size), against 0.71 after 8 rounds with Adam.

Sizes per scale (:data:`IMDB_SIZES`): ``ci`` seconds; ``cpu`` 10,000 training reviews of 128 words, 10 clients, 5 per
round, 30 rounds, hidden size 64 (width 0.25) — four to nine minutes a run on one core; ``paper`` every review, 256
words, the ``paper`` preset's 100 clients and 200 rounds, full width.
"""
from __future__ import annotations

from types import MappingProxyType

from subfl.experiments.config import ExperimentConfig, make_config

IMDB_TRAINING = MappingProxyType(dict(optimizer="adam", lr=0.003, grad_clip=1.0, local_epochs=1))
"""Local training of every method in the IMDB setting (all scales)."""

IMDB_VOCABULARY = 1001
"""Rows of the word embedding (Table 8: ``Embedding 1001 → 64``), the ``vocab_size`` of every scale."""

IMDB_SIZES = MappingProxyType({
    "ci": MappingProxyType(dict(dataset_options=dict(max_len=32, max_train=400, max_test=200))),
    "cpu": MappingProxyType(dict(num_clients=10, clients_per_round=5, rounds=30, width=0.25, eval_every=1,
                                 dataset_options=dict(max_len=128, max_train=10000, max_test=2000))),
    "paper": MappingProxyType(dict(dataset_options=dict(max_len=256))),
})
"""Sizes of the IMDB setting per scale (on top of the scale's common preset)."""


def imdb_config(method: str, keep: str = "0.2", *, partition: str = "iid", alpha: float | None = None,
                scale: str = "cpu", seed: int = 0, **overrides) -> ExperimentConfig:
    """The IMDB experiment of ``method`` with every client at keep ratio ``keep`` (``"1.0"`` for FedAvg).

    ``overrides``: any config field (``method_options={...}``, ``rounds=...``), applied last; a
    ``dataset_options`` override is merged into the scale's (``dataset_options=dict(vocab_size=10000)``).
    """
    if scale not in IMDB_SIZES:
        raise ValueError(f"scale={scale!r} is not valid; accepted: {', '.join(IMDB_SIZES)}")
    sizes = dict(IMDB_SIZES[scale])
    dataset_options = {"vocab_size": IMDB_VOCABULARY, **sizes.pop("dataset_options", {}),
                       **overrides.pop("dataset_options", {})}
    fields = {**IMDB_TRAINING, **sizes, "heterogeneity": "1.0" if method == "fedavg" else keep,
              "dataset_options": dataset_options, **overrides}
    return make_config(method, "imdb", model="sentiment_lstm", partition=partition, alpha=alpha, scale=scale,
                       seed=seed, **fields)


__all__ = ["IMDB_SIZES", "IMDB_TRAINING", "IMDB_VOCABULARY", "imdb_config"]
