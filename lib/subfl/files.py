"""Writing a file that other processes may read, or write, at the same time.

Every file the library and the book write for later reading (records, checkpoints, pretrained weights, token caches,
measurements) is written under a temporary name in its own folder and then renamed over the target: a reader sees the
complete old file or the complete new one, never a part. The temporary name is unique to the process *and* the call,
so two processes writing the same target at once (two workers that both copy a pretrained model from the store, two
kernels tokenising the same text) cannot rename each other's half-written file away.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def temporary_sibling(path: str | Path) -> Path:
    """A name in ``path``'s folder, hidden, ending in ``.tmp``, that no other process or call uses:
    ``.<name>.<pid>.<random>.tmp``."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")


def write_atomically(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp)`` to write a temporary sibling of ``path`` (:func:`temporary_sibling`), then rename it to
    ``path`` (``os.replace``, atomic on one file system). If ``write`` raises, the temporary file is removed and
    ``path`` is left as it was. Creates ``path``'s folder. Returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_bytes_atomically(path: str | Path, data: bytes) -> Path:
    """``data`` into ``path`` by :func:`write_atomically`."""
    return write_atomically(path, lambda tmp: tmp.write_bytes(data))


def copy_atomically(source: str | Path, target: str | Path) -> Path:
    """A copy of file ``source`` at ``target`` by :func:`write_atomically` (the copy is complete or absent)."""
    import shutil

    return write_atomically(target, lambda tmp: shutil.copyfile(source, tmp))
