"""The run directory (DESIGN §8): config, plan, metrics.csv, eval.csv, summary.json, params, plots.

Rows are appended as windows complete, so a run that dies keeps every row
written so far readable; summary.json is written last (atomically).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

from agents.common.files import write_atomic
from agents.sim.env import EVAL_COLUMNS, UPDATE_COLUMNS

__all__ = ["RunDir", "RunDirBusy", "RunDirLock", "ReplayDiverged", "clear_earlier_run", "read_csv", "unwritable",
           "upload", "write_json_atomic"]


# what a run writes beside the files it always writes anew (config.yaml, plan.json, metrics.csv, eval.csv):
# a new run in a directory an earlier run used removes the earlier run's, so a run that fails, or writes fewer
# of them (no update: no params.pt, no loss.png; fewer agents), leaves none of another run's beside its own
EARLIER_OUTPUTS = ("summary.json", "params.pt", "loss.png", "trace.json", "trace.records.jsonl", "statelog.jsonl",
                   "metrics.prom", "metrics-agent-*.prom", "endpoints.json", "prometheus-targets.json",
                   "agents/agent-*.log", "snapshots/*.pt", "recovery.jsonl")


def clear_earlier_run(run_dir: Path) -> list[str]:
    """Remove an earlier run's outputs from ``run_dir`` (not ``lockstep.log``, which is appended to, nor the
    checkpoints, which the checkpoint store clears); the names removed, relative to ``run_dir``."""
    gone = []
    for pattern in EARLIER_OUTPUTS:
        for path in sorted(Path(run_dir).glob(pattern)):
            if path.is_file():
                path.unlink()
                gone.append(path.relative_to(run_dir).as_posix())
    return gone


class RunDirBusy(RuntimeError):
    """Another lockstep controller runs in this run directory."""


class RunDirLock:
    """An exclusive lock on a run directory for one controller, held while it runs (``flock``: released when
    the process ends, however it ends). A second run or ``lockstep resume`` in the same directory would
    interleave its rows, its checkpoints and its summary with the first's."""

    NAME = ".lockstep.lock"

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / self.NAME
        self._f: Any = None

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> "RunDirLock":
        """Take the lock; RunDirBusy (naming the holder's pid) when another controller holds it."""
        import fcntl  # noqa: PLC0415 - POSIX, as the rest of the controller

        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise RunDirBusy(f"{self.path.parent} is in use by another lockstep controller (pid {holder}); "
                             "accepted: wait for it to end, or another hydra.run.dir") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._f = f
        return self

    def release(self) -> None:
        if self._f is not None:
            self.path.unlink(missing_ok=True)
            self._f.close()  # releases the lock
            self._f = None


def unwritable(path: str | Path, directory: bool = False) -> str | None:
    """Why ``path`` cannot be written (a file; ``directory``: a directory to write files in), or None.

    Asked before a command does its work, so that a bad ``--out`` is one sentence and not a traceback after
    the work is done and lost. It creates the missing directories, as the writer would, and tries the file
    (an existing one is opened for appending, a new one is created and removed): permissions, a read-only
    or pseudo file system (``/proc``) and a file where a directory is meant all answer here."""
    path = Path(path)
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"{path} cannot be written: {above} is a file, not a directory"
    try:
        if directory:
            if path.exists() and not path.is_dir():
                return f"{path} is a file, not a directory"
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".lockstep-probe-{os.getpid()}"
            probe.open("x").close()
            probe.unlink()
            return None
        if path.is_dir():
            return f"{path} is a directory, not a file"
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.open("a").close()
        else:
            path.open("x").close()
            path.unlink()
    except OSError as e:
        return f"{path} cannot be written: {e.strerror or e}" + (f" ({e.filename})" if e.filename and
                                                                  str(e.filename) != str(path) else "")
    return None


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV this module wrote; a last row cut short (the run was killed mid-write) is left out."""
    with open(path, newline="") as f:
        text = f.read()
    rows = list(csv.DictReader(io.StringIO(text)))
    if rows and (not text.endswith("\n") or None in rows[-1].values()):
        rows.pop()
    return rows


def _fmt(v: Any) -> Any:
    # repr of a float round-trips exactly, so bit-identical runs give byte-identical files
    return repr(v) if isinstance(v, float) else v


class ReplayDiverged(RuntimeError):
    """A replayed run produced a row that differs from the one already written (docs/recovery.md)."""


class _Table:
    """One CSV of the run directory, appended to; after :meth:`rewind` (a replay) the rows already on disk
    are checked against the replayed ones (every column but ``wall_*``) instead of being written again."""

    def __init__(self, path: Path, columns: tuple[str, ...], keep: bool):
        self.path, self.columns = path, columns
        self._wall = [i for i, c in enumerate(columns) if c.startswith("wall_")]
        existing = keep and path.exists() and path.stat().st_size > 0
        if existing:
            _cut_partial_line(path)
        self._f = open(path, "a" if existing else "w", newline="")
        self._w = csv.writer(self._f)
        if not existing:
            self._w.writerow(columns)
            self._f.flush()
        self._done: list[list[str]] = []  # rows on disk the replay has not reached yet
        self._digest = hashlib.sha256()  # of the rows passed so far (every column but wall_*): a checkpoint keeps it
        self.replayed = 0  # rows of this attempt that were already on disk
        self.rows = 0  # rows of the file this attempt has passed (written, replayed or kept from a checkpoint)
        if existing:
            self.rewind()

    def _passed(self, cells: list[str]) -> None:
        self._digest.update("\x1f".join(c for i, c in enumerate(cells) if i not in self._wall).encode() + b"\n")

    @property
    def digest(self) -> str:
        """The SHA-256 of the rows passed so far, every column but ``wall_*``."""
        return self._digest.hexdigest()

    def rewind(self, keep: int = 0, digest: str | None = None) -> None:
        """The run starts again from virtual time 0 (``keep`` = 0), or from a checkpoint taken after the first
        ``keep`` rows: those stay as they are; the rows on disk after them are what it must reproduce first.
        ``digest``: the checkpoint's :attr:`digest` of those rows, checked (rows changed after it: ReplayDiverged)."""
        self._f.flush()
        with open(self.path, newline="") as f:
            rows = list(csv.reader(f))
        if rows and tuple(rows[0]) != tuple(self.columns):
            raise ReplayDiverged(f"{self.path} has the columns {rows[0]}, not {list(self.columns)}: "
                                 "it was written by another lockstep version")
        if keep > len(rows) - 1:
            raise ReplayDiverged(f"{self.path} has {max(len(rows) - 1, 0)} rows, fewer than the {keep} a "
                                 "checkpoint counted")
        self._digest = hashlib.sha256()
        for r in rows[1:1 + keep]:
            self._passed(r)
        if digest is not None and self.digest != digest:
            raise ReplayDiverged(f"{self.path.name}'s first {keep} rows are not those its checkpoint counted "
                                 "(changed after it was written)")
        self._done = rows[1 + keep:]
        self._done.reverse()  # pop() from the end: the oldest row first
        self.replayed = 0
        self.rows = keep

    @property
    def replaying(self) -> bool:
        return bool(self._done)

    @property
    def to_replay(self) -> int:
        """Rows on disk the replay has not reproduced yet."""
        return len(self._done)

    def unreplayed(self) -> list[list[str]]:
        """The rows on disk the replay has not reproduced yet, in file order (they stay in the file)."""
        return self._done[::-1]

    def write(self, rows: list[tuple]) -> int:
        """Append ``rows``, skipping (after checking) those already on disk; returns how many were new."""
        new = 0
        for r in rows:
            cells = [str(_fmt(v)) if v is not None else "" for v in r]
            if self._done:
                old = self._done.pop()
                diff = [self.columns[i] for i in range(len(cells))
                        if i not in self._wall and (i >= len(old) or old[i] != cells[i])]
                if diff or len(old) != len(cells):
                    # row N of the file = its Nth row after the header (line N + 1), counted from the file's
                    # start, not from where this replay began (a checkpoint keeps the rows before it)
                    raise ReplayDiverged(
                        f"the replayed run differs from {self.path.name} row {self.rows + 1} "
                        f"(columns {', '.join(diff) or 'count'}: {old} on disk, {cells} replayed): the rows on "
                        "disk are not those this run produces (the file was edited, or written by another "
                        "lockstep version or another configuration)")
                self._passed(old)
                self.replayed += 1
                self.rows += 1
                continue
            self._w.writerow(cells)
            self._passed(cells)
            new += 1
            self.rows += 1
        if new:
            self._f.flush()
        return new

    def close(self) -> None:
        self._f.close()


def _cut_partial_line(path: Path) -> None:
    """Drop a last line without its newline (the process died while writing it)."""
    with open(path, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            f.truncate(end)


class RunDir:
    """Writers for one run directory. ``resume``: keep the CSVs already there and append after them."""

    def __init__(self, path: Path, extra_columns: tuple[str, ...] = (), resume: bool = False):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        # extra: e.g. the data-on-network totals
        self.metrics = _Table(self.path / "metrics.csv", (*UPDATE_COLUMNS, *extra_columns), resume)
        self.evals = _Table(self.path / "eval.csv", EVAL_COLUMNS, resume)
        self.n_updates = 0

    def rewind(self, position: dict[str, int] | None = None) -> None:
        """The run replays from virtual time 0 (its agents restarted), or from a checkpoint taken at
        ``position`` (:meth:`position`): check, do not rewrite, what is written after it."""
        position = position or {}
        self.metrics.rewind(position.get("metrics_rows", 0), position.get("metrics_sha256"))
        self.evals.rewind(position.get("eval_rows", 0), position.get("eval_sha256"))
        self.n_updates = position.get("metrics_rows", 0)

    def position(self) -> dict[str, int]:
        """How far the run has come in each CSV (rows, and their digest), for a checkpoint."""
        return {"metrics_rows": self.metrics.rows, "eval_rows": self.evals.rows,
                "metrics_sha256": self.metrics.digest, "eval_sha256": self.evals.digest}

    @property
    def replaying(self) -> bool:
        return self.metrics.replaying or self.evals.replaying

    def write_updates(self, rows: list[tuple]) -> int:
        self.n_updates += len(rows)
        return self.metrics.write(rows)

    def write_evals(self, rows: list[tuple]) -> int:
        return self.evals.write(rows)

    def close(self) -> None:
        self.metrics.close()
        self.evals.close()


def upload(run_dir: Path, url: str) -> str:
    """Copy ``run_dir`` to ``<url>/<run_dir name>`` with fsspec (``outputs.upload``); returns the destination.

    Any fsspec URL: ``file:///...``, ``s3://bucket/prefix`` (``pip install 'lockstep[upload]'`` brings s3fs and
    gcsfs; credentials come from the environment, e.g. AWS_ACCESS_KEY_ID or a mounted secret).
    """
    import fsspec  # noqa: PLC0415 - only a run that uploads needs it

    fs, root = fsspec.core.url_to_fs(url)
    dest = f"{root.rstrip('/')}/{Path(run_dir).name}"
    fs.makedirs(dest, exist_ok=True)
    for f in sorted(Path(run_dir).rglob("*")):
        if f.is_file() and f.name != RunDirLock.NAME:
            target = f"{dest}/{f.relative_to(run_dir).as_posix()}"
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(f), target)
    return f"{url.split('://', 1)[0]}://{dest}" if "://" in url else dest
