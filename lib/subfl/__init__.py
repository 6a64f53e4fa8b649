"""subfl: one simulation engine for federated learning with weak, heterogeneous clients.

The library behind the reproducibility book for PriSM, spectral model sharding, FLANC, FedP3 and CAFF.
Sub-packages: ``data`` (datasets, partitioners), ``models``, ``fl`` (the engine), ``methods`` (one module
per algorithm family), ``sampling``, ``costs``, ``metrics`` and ``experiments`` (configs, scales, cache).
"""
__version__ = "0.1.0"
