"""Where derived artefacts are kept on this machine: trained tokenizers and pretrained weights.

They are recomputed when missing (deterministically, from data available offline); the library commits none of
them (the book keeps copies of the pretrained models it reads in its run store). Each one is
keyed on its own configuration and a version constant of the code that makes it (e.g.
:data:`subfl.pretraining.PRETRAINING_VERSION`), not on source text.
"""
from __future__ import annotations

import os
from pathlib import Path


def artifact_root() -> Path:
    """``$SUBFL_ARTIFACTS_DIR``; else ``.subfl-artifacts/`` in a source checkout; else ``~/.cache/subfl``."""
    if os.environ.get("SUBFL_ARTIFACTS_DIR"):
        return Path(os.environ["SUBFL_ARTIFACTS_DIR"]).expanduser()
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").exists() and (checkout / "lib").is_dir():
        return checkout / ".subfl-artifacts"
    return Path.home() / ".cache" / "subfl"


def artifact_dir(kind: str) -> Path:
    """The folder of one kind of artefact (``"tokenizers"``, ``"pretrained"``)."""
    return artifact_root() / kind
