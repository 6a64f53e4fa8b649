"""subfl.files: a file written for others to read is complete or absent, even with writers racing."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from subfl.files import copy_atomically, temporary_sibling, write_atomically, write_bytes_atomically


def test_temporary_names_are_hidden_siblings_unique_per_call(tmp_path):
    target = tmp_path / "weights.pt"
    names = {temporary_sibling(target) for _ in range(100)}
    assert len(names) == 100
    for name in names:
        assert name.parent == tmp_path and name.name.startswith(".weights.pt.") and name.suffix == ".tmp"
        assert f".{os.getpid()}." in name.name


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")

    def broken(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomically(target, broken)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_writes_create_the_folder(tmp_path):
    target = write_bytes_atomically(tmp_path / "x" / "y" / "z.bin", b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"


def test_racing_copies_of_one_target_all_succeed(tmp_path):
    """Eight writers copying the same 2 MB file to the same target at once (two compute workers seeding one
    pretrained model, say): with one fixed temporary name, one writer renames away the file another is still
    writing and that one fails; here all 160 copies succeed and the target is the source, byte for byte."""
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(2 << 20))
    target = tmp_path / "out" / "weights.pt"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def writer() -> None:
        start.wait(timeout=30)
        for _ in range(20):
            try:
                copy_atomically(source, target)
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert target.read_bytes() == source.read_bytes()
    assert [p.name for p in target.parent.iterdir()] == ["weights.pt"]
