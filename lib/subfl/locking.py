"""One exclusive lock per artefact: two processes asked for the same run, or the same pretrained model, compute it
once.

A thin wrapper of :class:`filelock.FileLock` (an ``flock`` on a lock file) with a bounded wait: every wait ends, with
a :class:`TimeoutError` naming the lock file, after ``$SUBFL_LOCK_TIMEOUT_S`` seconds (default 12 h, the longest a
book run takes on one CPU thread).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

LOCK_TIMEOUT_S = 12 * 3600.0
"""How long a process waits for another one computing the same run (``$SUBFL_LOCK_TIMEOUT_S`` overrides it)."""


def lock_timeout_s() -> float:
    """``$SUBFL_LOCK_TIMEOUT_S`` as a number of seconds >= 0, else :data:`LOCK_TIMEOUT_S`."""
    text = os.environ.get("SUBFL_LOCK_TIMEOUT_S", "")
    if not text:
        return LOCK_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses NaN
        raise ValueError(f"$SUBFL_LOCK_TIMEOUT_S={text!r} is not valid; accepted: a number of seconds >= 0")
    return value


def lock_file_for(path: Path, lock_dir: Path) -> Path:
    """The lock file in ``lock_dir`` that guards the folder ``path`` (named by a hash of its absolute path, so no
    file is added beside the user's folders)."""
    digest = hashlib.sha256(str(Path(path).absolute()).encode()).hexdigest()[:24]
    return Path(lock_dir) / f"{digest}.lock"


@contextlib.contextmanager
def exclusive(lock_file: Path, what: str, timeout_s: float | None = None) -> Iterator[None]:
    """Hold ``lock_file`` exclusively for the block; wait at most ``timeout_s`` (default :func:`lock_timeout_s`) for
    another process holding it, then raise ``TimeoutError`` saying ``what`` it guards."""
    timeout = lock_timeout_s() if timeout_s is None else timeout_s
    Path(lock_file).parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_file))
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        raise TimeoutError(f"{what} has been held by another process for more than {timeout:g} s (lock {lock_file});"
                           f" raise $SUBFL_LOCK_TIMEOUT_S to wait longer (the lock is released when its process ends, so only a "
                           f"running process holds it)") from None
    try:
        yield
    finally:
        lock.release()
