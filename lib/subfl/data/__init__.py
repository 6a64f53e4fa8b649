"""Datasets (loading, checksums) and partitioners (iid, Dirichlet, k-classes, Pachinko, natural).

>>> from subfl.data import load_dataset, make_partition
>>> import numpy as np
>>> data = load_dataset("digits")
>>> parts = make_partition("dirichlet", data.train.labels, 10, np.random.default_rng(0), alpha=0.5)
"""
from .base import ArrayData, FederatedDataset, TokenWindows, token_windows
from .datasets import (DATASETS, TEXT_CORPORA, balanced_subset, clear_dataset_cache, load_dataset, load_text,
                       read_idx_gz, tokenize_review)
from .manifest import (ENV_DATA_ROOT, dataset_files, default_data_root, how_to_obtain, load_manifest,
                       manifest_entry, require_file, resolve_data_root, sha256_file, verify_file)
from .partition import (PARTITIONS, dirichlet_allocation, dirichlet_equal, dirichlet_groups, dirichlet_prior, iid,
                        k_classes, label_histogram, local_test_split, make_partition, natural, pachinko)

__all__ = [
    "ArrayData", "FederatedDataset", "TokenWindows", "token_windows",
    "DATASETS", "TEXT_CORPORA", "load_dataset", "load_text", "clear_dataset_cache", "balanced_subset",
    "read_idx_gz", "tokenize_review",
    "ENV_DATA_ROOT", "default_data_root", "resolve_data_root", "load_manifest", "manifest_entry",
    "dataset_files", "how_to_obtain", "require_file", "sha256_file", "verify_file",
    "PARTITIONS", "iid", "dirichlet_equal", "dirichlet_prior", "dirichlet_allocation", "dirichlet_groups",
    "k_classes", "pachinko", "natural", "make_partition", "label_histogram", "local_test_split",
]
