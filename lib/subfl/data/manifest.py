"""The data manifest: which files subfl reads, their sha256, where they came from, and where to find them.

The manifest (``manifest.json``, shipped inside this package) has one entry per data file::

    {"name": dataset, "file": file name, "sha256": ..., "bytes": ..., "source": ..., "license": ...,
     "obtain": how to get it, optional "url" / "notes" / "citation"}

Files are looked up in a *data root*: the ``data_root=`` argument, else :func:`default_data_root`.
"""
from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterable

ENV_DATA_ROOT = "SUBFL_DATA_ROOT"
"""Environment variable naming the folder that holds the data files."""

_CHUNK = 1 << 20


def default_data_root() -> Path:
    """Where data files are looked for when no ``data_root`` is given.

    In order: the ``SUBFL_DATA_ROOT`` environment variable if set; else the repository's ``data/`` folder
    when the package runs from a checkout (``lib/subfl/../../data`` exists); else ``~/.cache/subfl/data``.
    """
    env = os.environ.get(ENV_DATA_ROOT)
    if env:
        return Path(env).expanduser()
    checkout_data = Path(__file__).resolve().parents[3] / "data"
    if (checkout_data.parent / "lib" / "subfl").is_dir() and checkout_data.is_dir():
        return checkout_data
    return Path.home() / ".cache" / "subfl" / "data"


def resolve_data_root(data_root: str | os.PathLike | None) -> Path:
    """``data_root`` as a :class:`~pathlib.Path`, or :func:`default_data_root` when it is ``None``."""
    if data_root is None:
        return default_data_root()
    if not isinstance(data_root, (str, os.PathLike)):
        raise TypeError(f"data_root must be a str, a path or None, got {type(data_root).__name__} "
                        f"({data_root!r})")
    return Path(data_root).expanduser()


@lru_cache(maxsize=1)
def _manifest_text() -> str:
    return resources.files(__package__).joinpath("manifest.json").read_text(encoding="utf-8")


def load_manifest() -> dict:
    """The parsed manifest (a fresh dict on each call, so callers may modify it freely)."""
    return json.loads(_manifest_text())


def manifest_entry(filename: str) -> dict | None:
    """The manifest entry whose ``file`` is ``filename`` (its base name), or ``None`` if there is none."""
    base = Path(filename).name
    for entry in load_manifest()["files"]:
        if entry["file"] == base:
            return entry
    return None


def dataset_files(name: str) -> list[dict]:
    """All manifest entries of the dataset ``name`` (e.g. the four Fashion-MNIST files)."""
    return [entry for entry in load_manifest()["files"] if entry["name"] == name]


@lru_cache(maxsize=256)
def _digest_cached(path: str, size: int, mtime_ns: int, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _file_digest(path: str | os.PathLike, algorithm: str) -> str:
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return _digest_cached(str(resolved), stat.st_size, stat.st_mtime_ns, algorithm)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file; memoised per (path, size, mtime) so an unchanged file is hashed once."""
    return _file_digest(path, "sha256")


def verify_file(path: str | os.PathLike, entry: dict) -> None:
    """Check that the file at ``path`` has the sha256 recorded in the manifest ``entry``.

    An entry may also carry ``upstream_md5`` (Fashion-MNIST: the manifest's sha256 is the Debian package's
    recompressed file; the original upstream file, identified by its published md5, is accepted too).
    Raises ``ValueError`` naming the file, the expected and the actual hash (and sizes) on a mismatch;
    ``FileNotFoundError`` if the file does not exist. Hashes are memoised in-process per
    (path, size, mtime), so verifying on every load costs one hash per file and process.
    """
    if not isinstance(entry, dict) or "sha256" not in entry:
        raise ValueError(f"entry must be a manifest entry (a dict with a 'sha256' key), got {entry!r}")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"cannot verify {str(path)!r}: no such file")
    actual = sha256_file(path)
    expected = str(entry["sha256"]).lower()
    if actual != expected and entry.get("upstream_md5") and _file_digest(path, "md5") == entry["upstream_md5"]:
        return
    if actual != expected:
        size = path.stat().st_size
        raise ValueError(
            f"checksum mismatch for {str(path)!r}: expected sha256 {expected} "
            f"({entry.get('bytes', '?')} bytes, from {entry.get('source', 'the manifest')}), "
            f"got sha256 {actual} ({size} bytes). The file is corrupt, truncated or a different "
            f"version; replace it, or pass verify=False to load it anyway.")


def how_to_obtain(filename: str) -> str:
    """One sentence on where ``filename`` comes from and how to get it, taken from the manifest."""
    entry = manifest_entry(filename)
    if entry is None:
        return f"{filename!r} is not listed in subfl's data manifest."
    text = f"{entry['file']!r} ({entry['name']}) comes from {entry['source']}; license: {entry['license']}."
    if entry.get("obtain"):
        text += f" To obtain it: {entry['obtain']}."
    return text


def require_file(data_root: str | os.PathLike, filename: str,
                 also_look_in: Iterable[str | os.PathLike] = ()) -> Path:
    """The path of ``filename`` under ``data_root`` (or under one of ``also_look_in``, in order).

    Raises ``FileNotFoundError`` saying which file is missing, every place it was looked for, where the
    file comes from (the manifest's ``source``) and how to point subfl at it (``SUBFL_DATA_ROOT`` or
    ``data_root=``).
    """
    folders = [Path(data_root), *(Path(folder) for folder in also_look_in)]
    for folder in folders:
        candidate = folder / filename
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(folder / filename) for folder in folders)
    raise FileNotFoundError(
        f"data file {filename!r} not found (looked for {looked}). {how_to_obtain(filename)} "
        f"Then put it in a folder and pass data_root=<folder> or set the {ENV_DATA_ROOT} environment "
        f"variable to it (the default data root is {default_data_root()}).")
