"""Counter-based (keyed) random draws — DESIGN §4.

Every random number lockstep uses is a pure function of a key such as
``(seed, "latency", src, dst, msg_seq)``. No shared stream is consumed in an
order that depends on event processing, so results do not depend on how
vworkers are placed on agents or in which order events at one instant run.
"""
from __future__ import annotations

import hashlib
import struct

import numpy as np

__all__ = ["key_bytes", "generator", "uniform", "key_int"]


def key_bytes(*key: object) -> bytes:
    """A stable 128-bit digest of a key tuple of ints, strings and floats.

    BLAKE2b (16 bytes) of the parts in order: an int (or bool) as ``b"i"`` + 16 bytes little-endian signed,
    a str as ``b"s"`` + its UTF-8 length (4 bytes little-endian) + the bytes, a float as ``b"f"`` + its IEEE
    double (little-endian). Every draw of every run depends on these bytes: they never change
    (tests/engine/test_keyed.py pins them).
    """
    h = hashlib.blake2b(digest_size=16)
    for part in key:
        if isinstance(part, int):  # bool too
            h.update(b"i" + int(part).to_bytes(16, "little", signed=True))
        elif isinstance(part, str):
            data = part.encode()
            h.update(b"s" + len(data).to_bytes(4, "little") + data)
        elif isinstance(part, float):
            h.update(b"f" + struct.pack("<d", part))
        else:
            raise TypeError(f"keyed draw: unsupported key part {part!r} ({type(part).__name__})")
    return h.digest()


def key_int(*key: object) -> int:
    """A 64-bit unsigned integer derived from the key."""
    return int.from_bytes(key_bytes(*key)[:8], "little")


def generator(*key: object) -> np.random.Generator:
    """A fresh numpy Generator (Philox) whose whole stream is determined by the key."""
    k = key_bytes(*key)
    return np.random.Generator(np.random.Philox(key=int.from_bytes(k, "little")))


def uniform(*key: object) -> float:
    """One uniform draw in [0, 1) from the key (53 bits of the digest, no Generator needed)."""
    return (key_int(*key) >> 11) * (1.0 / (1 << 53))
