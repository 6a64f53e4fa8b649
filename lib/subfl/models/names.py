"""The table of model names :func:`~subfl.models.registry.build_model` accepts (data only).

Each entry names its class by import path (``"module:attribute"``), resolved when the model is built. A run's
key covers the ``version`` of *its* model's entry (:mod:`subfl.experiments.provenance`), so adding a model, or
editing one, re-keys no other run.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class ModelSpec:
    """What :func:`~subfl.models.registry.build_model` knows about one model name.

    ``constructor`` is ``"subfl.models.<module>:<callable>"``; the callable takes
    ``(num_classes, input_shape, *, width, norm, **options)``.
    """

    name: str
    constructor: str
    default_norm: str
    options: tuple[str, ...] = ()
    description: str = ""
    version: int = 1
    """Bumped whenever the model computes something different for the same arguments and initial seed (the
    architecture, its initialisation or its defaults); part of every run key (:mod:`subfl.experiments.provenance`)."""

    @property
    def module(self) -> str:
        """The module that defines the model (``"subfl.models.cnn"``)."""
        return self.constructor.split(":", 1)[0]


_SPECS = MappingProxyType({
    spec.name: spec for spec in (
        ModelSpec("resnet18", "subfl.models.resnet:ResNet18", "bn", (), "CIFAR ResNet-18 (3x3 stem, no max-pool)"),
        ModelSpec("vgg11", "subfl.models.vgg:VGG11", "bn", (), "VGG-11 (config A), adaptive-pool head"),
        ModelSpec("cnn", "subfl.models.cnn:FedAvgCNN", "none", (), "FedAvg CNN of McMahan et al. 2017"),
        ModelSpec("mlp", "subfl.models.mlp:MLP", "none", ("hidden",), "MLP, FedAvg 2NN by default"),
        ModelSpec("flanc_cnn", "subfl.models.composed:FlancCNN", "none", (),
                  "FLANC's Fashion-MNIST CNN (released code)"),
        ModelSpec("fedp3_cnn", "subfl.models.fedp3_nets:FedP3CNN", "none", ("padding",),
                  "FedP3 Table 4 CNN: 2 conv 5x5 (64), 3 FC"),
        ModelSpec("fedp3_mlp", "subfl.models.fedp3_nets:FedP3MLP", "none", ("hidden",),
                  "FedP3 EMNIST-L MLP 784-1024-1024-1024"),
        ModelSpec("char_rnn", "subfl.models.char_rnn:CharLSTM", "none", (),
                  "one-layer character LSTM, one Linear per gate map (FLANC's Shakespeare RNN)",
                  version=2),  # 2: a composed gate's matrix is built once per forward (char_rnn.per_forward_map)
        ModelSpec("sentiment_lstm", "subfl.models.sentiment_lstm:SentimentLSTM", "none",
                  ("vocab_size", "embedding_dim"), "word LSTM classifier on the char_rnn cell (PriSM's IMDB model)"),
        ModelSpec("tiny_gpt", "subfl.models.transformers:tiny_gpt", "none",
                  ("vocab_size", "layers", "embed_dim", "heads", "context_length", "mlp_ratio", "dropout",
                   "tie_weights"), "GPT-style causal LM (CAFF): embedding 96, 3 heads"),
        ModelSpec("tiny_vit", "subfl.models.transformers:tiny_vit", "none",
                  ("layers", "embed_dim", "heads", "patch_size", "mlp_ratio", "dropout", "pool"),
                  "ViT (CAFF): patch 4, embedding 192, 6 heads"),
    )
})
