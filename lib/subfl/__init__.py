"""subfl: one simulation engine for federated learning with weak, heterogeneous clients.

The library behind the reproducibility book for PriSM, spectral model sharding, FLANC, FedP3 and CAFF.
Sub-packages: ``data`` (datasets, partitioners), ``models``, ``fl`` (the engine), ``methods`` (one module
per algorithm family), ``sampling``, ``costs``, ``metrics``, ``pretraining`` and ``experiments`` (configs, scales,
run keys, the runner). The book that uses it is the separate package ``subfl_book``.
"""
__version__ = "0.2.0"
