"""Writing files that a reader (or a crash) never sees half-written, and bytes held in pieces."""
from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["Blob", "atomic_file", "headed", "read_headed", "write_atomic"]


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """A temporary file beside ``path``, renamed over it when the block ends without an error.

    Readers see the old file or the new one, never a part; on an error the temporary file is removed
    and ``path`` is left as it was. The file is made readable by others (0644), as a plain ``open``
    would (a Prometheus server may run as another user).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return Path(path)


class Blob:
    """Bytes held as the pieces whose concatenation they are (a checkpoint: joining them would copy it whole)."""

    __slots__ = ("pieces", "nbytes", "live")

    def __init__(self, pieces: list[Any], live: bool = False):
        """``live``: some pieces are views of memory that their owner changes once it goes on — write them
        before it does."""
        self.pieces = [m for m in (memoryview(p).cast("B") for p in pieces) if m.nbytes]
        self.nbytes = sum(m.nbytes for m in self.pieces)
        self.live = live

    def __len__(self) -> int:
        return self.nbytes

    def chunks(self, size: int) -> list[memoryview]:
        """Views of at most ``size`` bytes each, in order (none copied)."""
        return [m[i:i + size] for m in self.pieces for i in range(0, m.nbytes, size)]

    def tobytes(self) -> bytes:
        return b"".join(self.pieces)


def headed(head: Any, pieces: list[Any], live: bool = False) -> Blob:
    """``[8-byte length of the pickled head][head][pieces…]`` as a :class:`Blob` (the pieces not copied)."""
    h = pickle.dumps(head, protocol=pickle.HIGHEST_PROTOCOL)
    return Blob([len(h).to_bytes(8, "little"), h, *pieces], live=live)


def read_headed(data: Any) -> tuple[Any, memoryview]:
    """The inverse of :func:`headed` on its bytes (or the Blob): ``(head, a view of the rest)``; ValueError
    when they are too short. The head is unpickled: only for bytes trusted like the run's config."""
    mv = memoryview(data.tobytes() if isinstance(data, Blob) else data).cast("B")
    n = int.from_bytes(mv[:8], "little")
    if mv.nbytes < 8 or n > mv.nbytes - 8:
        raise ValueError(f"{mv.nbytes} bytes do not hold a head of {n} bytes")
    return pickle.loads(mv[8:8 + n]), mv[8 + n:]  # noqa: S301 - see the docstring
