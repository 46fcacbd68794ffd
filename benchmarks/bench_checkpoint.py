"""Committing an in-process checkpoint the size of the 10 000-vworker run's (docs/benchmarks.md, "Checkpoints
the run does not wait for the disk"): ``CheckpointStore.commit_now`` as it is — the files written with each
piece's CRC-32 taken as it is written; the run waits for that only, the sync to the disk and the commit follow
on a thread — against the commit before it (written, synced, then SHA-256 taken: the run waited for all of it),
on the same Blob, in this process. Both the time the run waits and the time to the commit are printed.

The Blob is PIECES pieces of PIECE_KB kB (default 10 000 of 326 kB: 3.26 GB, one MLP parameter vector per
vworker), views of one array of random bytes. Each variant commits REPEATS times, interleaved; the best and the
median are printed, with the hash alone (sha256 and crc32 over the pieces, no file) to say where the time goes.
usage: python benchmarks/bench_checkpoint.py [PIECES] [PIECE_KB] [REPEATS] [--dir DIR]
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import load_average  # also puts the repository on sys.path

from agents.common.files import Blob, write_atomic
from controller.checkpoints import CheckpointStore, _Crc32


def _commit_before(root: Path, blob: Blob) -> None:
    """The in-process commit of 2026-11-27 (7100ca0), agent file and manifest: write and sync every piece, then
    hash them all again; the run waited for all of it."""
    d = root / "checkpoints" / "1"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "agent-0.ckpt", "wb") as f:
        for m in blob.pieces:
            f.write(m)
        f.flush()
        os.fsync(f.fileno())
    h = hashlib.sha256()
    for m in blob.pieces:
        h.update(m)
    write_atomic(d / "manifest.json", json.dumps({"agents": [{"sha256": h.hexdigest()}]}))


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    pieces = int(args[0]) if args else 10_000
    piece = (int(args[1]) if len(args) > 1 else 326) * 1000
    repeats = int(args[2]) if len(args) > 2 else 3
    where = sys.argv[sys.argv.index("--dir") + 1] if "--dir" in sys.argv else None
    whole = memoryview(np.random.default_rng(0).integers(0, 256, pieces * piece, dtype=np.uint8))
    blob = Blob([whole[i * piece:(i + 1) * piece] for i in range(pieces)])  # distinct pages, as a run's tensors
    print(f"bench_checkpoint: {pieces} pieces of {piece / 1e3:.0f} kB ({blob.nbytes / 1e9:.2f} GB), best of "
          f"{repeats}; load average {load_average()}", flush=True)

    def hash_all(h) -> None:
        for m in blob.pieces:
            h.update(m)

    def commit_now(root: Path) -> None:
        """The run's wait is what this call takes; the commit that follows is timed by ``done``."""
        store = CheckpointStore(root, "{}")
        store.commit_now(1, 0, {0: blob}, {}, {}, lambda _dir, took, _waited: timings["now: committed"].append(took))
        waits.append(store)

    timings: dict[str, list[float]] = {"sha256 alone": [], "crc32 alone": [], "before: the run waits": [],
                                       "now: the run waits": [], "now: committed": []}
    waits: list[CheckpointStore] = []
    with tempfile.TemporaryDirectory(dir=where) as d:
        variants = {"sha256 alone": lambda: hash_all(hashlib.sha256()), "crc32 alone": lambda: hash_all(_Crc32()),
                    "before: the run waits": lambda: _commit_before(Path(d), blob),
                    "now: the run waits": lambda: commit_now(Path(d))}
        for _ in range(repeats):
            for name, variant in variants.items():
                t0 = time.perf_counter()
                variant()
                timings[name].append(time.perf_counter() - t0)
                while waits:  # the commit goes on after the run's wait: let it end before the next variant
                    waits.pop().wait()
                print(f"  {name}: {timings[name][-1]:.2f} s", flush=True)
    for name, ts in timings.items():
        print(f"{name:>30}: best {min(ts):6.2f} s, median {statistics.median(ts):6.2f} s "
              f"({blob.nbytes / min(ts) / 1e9:.2f} GB/s)")
    b, n = statistics.median(timings["before: the run waits"]), statistics.median(timings["now: the run waits"])
    print(f"the run waits {b / n:.2f}x less than before (median against median)")


if __name__ == "__main__":
    main()
