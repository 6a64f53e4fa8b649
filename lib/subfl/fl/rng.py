"""Explicit randomness: every random draw comes from a generator derived from (seed, *keys).

A run is a pure function of (config, seed): nothing reads global RNG state. Keys are round numbers,
client ids and short strings naming the purpose ("sampling", "local", "profiles", ...), so two purposes
never share a stream and resuming at round t reproduces exactly the draws of an uninterrupted run.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch


def _key_to_int(key: int | str) -> int:
    if isinstance(key, (bool, np.bool_)):
        raise TypeError("rng keys must be int or str, got bool")
    if isinstance(key, (int, np.integer)):
        if key < 0:
            raise ValueError(f"rng keys must be non-negative integers, got {key}")
        return int(key)
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8"))
    raise TypeError(f"rng keys must be int or str, got {type(key).__name__}")


def seed_sequence(seed: int, *keys: int | str) -> np.random.SeedSequence:
    """A :class:`numpy.random.SeedSequence` for ``seed`` and the purpose ``keys``."""
    return np.random.SeedSequence([_key_to_int(seed), *(_key_to_int(k) for k in keys)])


def numpy_rng(seed: int, *keys: int | str) -> np.random.Generator:
    """A numpy Generator derived from (seed, *keys)."""
    return np.random.default_rng(seed_sequence(seed, *keys))


def torch_generator(seed: int, *keys: int | str, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch Generator derived from (seed, *keys)."""
    state = seed_sequence(seed, *keys).generate_state(2, dtype=np.uint32)
    g = torch.Generator(device=device)
    g.manual_seed(int(state[0]) << 32 | int(state[1]))
    return g
