"""Every registered method on Flower (optional extra ``flower``: ``pip install 'subfl[flower]'``).

* :mod:`subfl.flower.codec` — the library's payloads (named tensors + JSON config) as ArrayRecord / ConfigRecord /
  MetricRecord, dtype and shape preserved;
* :mod:`subfl.flower.client` — the ClientApp: ``local_update`` on the client's own partition with the engine's keyed
  generators;
* :mod:`subfl.flower.server` — the ServerApp: the engine's round loop (seeded client selection, ``configure`` /
  ``aggregate`` / evaluation, ledger, history, checkpoints) with the local updates sent to Flower nodes;
* :mod:`subfl.flower.simulation` — runs on Flower's simulation runtime; :mod:`subfl.flower.app` — the apps a
  deployment (``flwr run``) loads.

``subfl run --engine flower`` runs an experiment through the simulation runtime.
"""
from __future__ import annotations

import importlib.util


def available() -> bool:
    """Whether Flower (``flwr``) is installed."""
    return importlib.util.find_spec("flwr") is not None
