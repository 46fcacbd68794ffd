"""Fashion-MNIST from local IDX files — DESIGN §7. Nothing here downloads.

Search order: ``data.root`` when set (and then only it), else Debian's
``dataset-fashion-mnist`` package, else the torchvision layout under ``./data``.

Decoding the gzip'd images and normalising them takes ~0.3 s (more on a busy machine), paid by every
process that reads them (the controller's validation, the agents' forkserver, every ``python -m agents``).
So the normalised images are kept, once per machine, in :func:`data_cache_dir` (one ``.npy`` per images
file, named by the file's path, size and modification time) and later processes map that file instead
(~3 ms; ``benchmarks/bench_data.py``). The values are
the decoded ones, bit for bit; a file that changes gets a new entry; an unwritable cache is skipped.
"""
from __future__ import annotations

import functools
import gzip
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["Dataset", "DataNotFoundError", "IDXFormatError", "load_fashion_mnist", "read_idx",
           "DEBIAN_DIR", "LOCAL_DIR", "NORMALISATION", "CACHE_FROM_BYTES", "data_cache_dir"]

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
LOCAL_DIR = Path("data/FashionMNIST/raw")
"""Relative to the working directory, as torchvision lays it out under ``root="./data"``."""

NORMALISATION = {"fashion-mnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}
"""(mean, std) of the training pixels in [0, 1], per data set."""

NUM_CLASSES = 10
_PARTS = ("train-images", "train-labels", "t10k-images", "t10k-labels")
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DataNotFoundError(FileNotFoundError):
    """No usable copy of the data set in any searched location."""


class IDXFormatError(ValueError):
    """An IDX file that cannot be parsed (bad magic, truncated, wrong shape)."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """Normalised images ``[N, 1, H, W]`` float32 and int64 labels; shared per process, do not mutate."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    source: str
    num_classes: int = NUM_CLASSES


def load_fashion_mnist(root: str | os.PathLike | None = None) -> Dataset:
    """Load Fashion-MNIST (or MNIST from an ``MNIST/raw`` layout) from the first location that has it.

    With ``root`` set, only ``root`` is searched: the IDX files directly in it, or
    its ``FashionMNIST/raw`` / ``MNIST/raw``. A user who names a directory wants
    that data, so a typo must not silently fall back to another data set.
    """
    if root is not None:
        root = Path(root).expanduser()
        candidates = [root, root / "FashionMNIST" / "raw", root / "MNIST" / "raw"]
    else:
        candidates = [DEBIAN_DIR, LOCAL_DIR]
    for directory in candidates:
        files = _idx_files(directory)
        if files is not None:
            name = "mnist" if directory.parent.name == "MNIST" else "fashion-mnist"
            return _load_files(tuple(str(files[p].resolve()) for p in _PARTS), name)
    raise DataNotFoundError(_not_found_message(root))


def _not_found_message(root: Path | None) -> str:
    wanted = "train-images-idx3-ubyte(.gz) and the other three IDX files"
    if root is None:
        return (f"Fashion-MNIST not found: data.root is not set, and neither {DEBIAN_DIR}/ nor "
                f"./{LOCAL_DIR}/ holds {wanted}; install it with "
                f"`apt-get install dataset-fashion-mnist` or set data.root=<dir with the IDX files>.")
    return (f"Fashion-MNIST not found in data.root={root}: neither it nor its FashionMNIST/raw/ or "
            f"MNIST/raw/ holds {wanted} (the defaults {DEBIAN_DIR}/ and ./{LOCAL_DIR}/ are searched "
            f"only when data.root is unset); point data.root=<dir> at the IDX files, or unset it "
            f"and `apt-get install dataset-fashion-mnist`.")


def _idx_files(directory: Path) -> dict[str, Path] | None:
    """The four IDX files in ``directory``, or None when it holds none of them.

    A directory holding only some of them is an error: it is clearly meant as the
    data set, so skipping it would hide the problem.
    """
    if not directory.is_dir():
        return None
    found: dict[str, Path] = {}
    for part in _PARTS:
        ndim = "3" if part.endswith("images") else "1"
        for stem in (f"{part}-idx{ndim}-ubyte", f"{part}.idx{ndim}-ubyte"):
            hits = [directory / (stem + ext) for ext in ("", ".gz") if (directory / (stem + ext)).is_file()]
            if hits:
                found[part] = hits[0]
                break
    if not found:
        return None
    missing = [p for p in _PARTS if p not in found]
    if missing:
        raise DataNotFoundError(
            f"{directory} holds only part of the data set: {', '.join(missing)} "
            f"(-idx?-ubyte or .gz) are missing; add them or point data.root elsewhere.")
    return found


@functools.lru_cache(maxsize=None)
def _load_files(paths: tuple[str, str, str, str], name: str) -> Dataset:
    """Parse and normalise once per process; ``paths`` follow ``_PARTS``."""
    train_images, train_labels, test_images, test_labels = map(Path, paths)
    mean, std = NORMALISATION[name]
    train_x, train_y = _read_pair(train_images, train_labels, mean, std)
    test_x, test_y = _read_pair(test_images, test_labels, mean, std)
    return Dataset(name=name, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                   source=str(train_images.parent))


def _read_pair(images_path: Path, labels_path: Path, mean: float,
               std: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised images (from the decoded cache when it holds them) and their labels, checked together."""
    images = _cached_images(images_path, mean, std)
    if images is None:
        raw = read_idx(images_path)
        if raw.ndim != 3:
            raise IDXFormatError(f"{images_path}: expected 3 dimensions (N, H, W), found shape {raw.shape}.")
        images = _normalise(raw, mean, std)
        _store_images(images_path, mean, std, images)
    labels = read_idx(labels_path)
    if labels.ndim != 1 or len(labels) != len(images):
        raise IDXFormatError(f"{labels_path}: expected {len(images)} labels (one per image in "
                             f"{images_path.name}), found shape {labels.shape}.")
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise IDXFormatError(f"{labels_path}: labels must lie in [0, {NUM_CLASSES}), "
                             f"found [{labels.min()}, {labels.max()}].")
    return images, torch.from_numpy(labels.astype(np.int64))


# ------------------------------------------------------------ decoded cache
CACHE_FROM_BYTES = 1 << 20
"""Image files smaller than this are decoded every time (a cache would not pay; test fixtures stay out)."""

_CACHE_FORMAT = 1


def data_cache_dir() -> Path | None:
    """Where decoded images are kept: ``$LOCKSTEP_DATA_CACHE`` (``off`` for nowhere), else
    ``$XDG_CACHE_HOME/lockstep/data`` or ``~/.cache/lockstep/data``."""
    env = os.environ.get("LOCKSTEP_DATA_CACHE")
    if env:
        return None if env == "off" else Path(env)
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lockstep" / "data"
    except (RuntimeError, KeyError):  # no HOME and no passwd entry (a container's arbitrary user): no cache
        return None


def _cache_path(images_path: Path, mean: float, std: float) -> Path | None:
    """The cache file of an images file as it is now (path, size and modification time, normalisation), or
    None when it is not cached at all. A changed file gets a new name, so a stale entry is never read."""
    directory = data_cache_dir()
    if directory is None:
        return None
    try:
        st = images_path.stat()
    except OSError:
        return None
    if st.st_size < CACHE_FROM_BYTES:
        return None
    source = zlib.crc32(str(images_path.resolve()).encode())
    version = zlib.crc32(f"{_CACHE_FORMAT}|{st.st_size}|{st.st_mtime_ns}|{mean!r}|{std!r}".encode())
    return directory / f"{images_path.name.split('.')[0]}-{source:08x}-{version:08x}.npy"


def _cached_images(images_path: Path, mean: float, std: float) -> torch.Tensor | None:
    """Normalised images from the cache, memory-mapped copy-on-write (every process on the machine shares
    the pages; writes, which nothing makes, would stay private), or None."""
    path = _cache_path(images_path, mean, std)
    if path is None or not path.is_file():
        return None
    try:
        arr = np.load(path, mmap_mode="c")
    except (OSError, ValueError):  # unreadable or cut short: decode instead (and store it again)
        return None
    if arr.dtype != np.float32 or arr.ndim != 4 or arr.shape[1] != 1:
        return None
    return torch.from_numpy(arr)


def _store_images(images_path: Path, mean: float, std: float, images: torch.Tensor) -> None:
    """Keep decoded images for the next process (written to a temporary name, then renamed: a reader sees
    a whole file or none). Older entries of the same source are removed. A cache that cannot be written
    (a read-only file system, a pod's root) is skipped silently: it only saves time."""
    path = _cache_path(images_path, mean, std)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.save(f, images.numpy())
        os.replace(tmp, path)
        stem = path.name.rsplit("-", 1)[0]
        for old in path.parent.glob(f"{stem}-*.npy"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        pass


def _normalise(images: np.ndarray, mean: float, std: float) -> torch.Tensor:
    x = images.astype(np.float32)[:, None]
    x *= np.float32(1.0 / (255.0 * std))
    x -= np.float32(mean / std)
    return torch.from_numpy(x)


def _gunzip(data: bytes) -> bytes:
    """zlib is about 2x faster than ``gzip.decompress``; the latter handles multi-member files."""
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = d.decompress(data)
    if d.unused_data or not d.eof:
        return gzip.decompress(data)
    return out


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Parse one IDX file (plain or gzip): magic ``00 00 <dtype> <ndim>``, big-endian dims, data."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = _gunzip(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise IDXFormatError(f"{path}: cannot read or decompress ({e}).") from e
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise IDXFormatError(f"{path}: not an IDX file (magic bytes {raw[:4].hex() or 'missing'}, "
                             f"expected 0000 then a type code in {sorted(_IDX_DTYPES)} and a rank).")
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IDXFormatError(f"{path}: truncated header ({len(raw)} bytes, rank {ndim} needs {header}).")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise IDXFormatError(f"{path}: header says shape {shape} ({expected} bytes of data), "
                             f"but the file has {len(raw) - header}.")
    # Read-only view of ``raw`` for bytes; a native-order copy for wider types.
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="), copy=False)
