"""Writing files that a reader (or a crash) never sees half-written."""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_file", "write_atomic"]


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
