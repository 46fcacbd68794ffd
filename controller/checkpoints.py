"""Coordinated checkpoints of the agents (docs/recovery.md, "Checkpoints"): take them, keep them, read them back.

With direct windows the controller asks every agent, every ``recovery.checkpoint_every_s`` wall seconds,
for a checkpoint at one window ``K`` a little ahead of the furthest agent (call ``checkpoint``). Each agent,
at the top of its window ``K``, sends its rows of the windows before ``K`` and then its checkpoint: its
core's snapshot (:func:`agents.checkpoint.snapshot`) and its window loop's view. While it waits for the
others, the controller reads nothing more of an agent that has answered, so when the last answer is in,
its collector holds exactly the rows of the windows before ``K``: that is the moment it saves its own
state. A checkpoint is *committed* when ``checkpoints/<K>/`` holds every agent's file, the controller's
state and ``manifest.json`` (with each file's size and CRC-32), and ``checkpoints/latest`` names ``K`` (written,
then renamed); older ones are deleted then, and all of them when the run completes.

A lost agent, or ``lockstep resume``, starts the new agents from the latest committed checkpoint
instead of from virtual time 0. A checkpoint that cannot be used (a file missing, truncated or changed, a
plan that differs) costs one warning and a replay from virtual time 0, as without checkpoints.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from agents.common.files import Blob, write_atomic

__all__ = ["Checkpointer", "CheckpointStore", "Checkpoint", "CheckpointUnusable", "Written", "DIR_NAME"]

log = logging.getLogger("lockstep.controller")

DIR_NAME = "checkpoints"
FORMAT = 2  # manifest.json's layout: 2 gives each file's CRC-32, 1 (still read) its SHA-256
READABLE = (1, 2)
REFUSALS_BEFORE_GIVING_UP = 3  # NotCheckpointable this many rounds in a row: stop asking
FIRST_SLACK = 8  # windows between the furthest agent reported and K, at first; doubled after each miss
COST_SHARE = 10  # a checkpoint that took c wall seconds to write: the next is asked for no sooner than 10 c later


class CheckpointUnusable(RuntimeError):
    """The latest checkpoint cannot be used (one sentence); the run replays from virtual time 0."""


def plan_hash(plan_json: str) -> str:
    return hashlib.sha256(plan_json.strip().encode()).hexdigest()


@dataclass
class Checkpoint:
    """A committed checkpoint, read back and verified."""

    window: int
    path: Path
    manifest: dict[str, Any]
    controller: dict[str, Any]  # the controller's state (collector, observer, direct windows' view)

    def agent_blob(self, agent: int) -> bytes:
        entry = self.manifest["agents"][agent]
        data = _read_checked(self.path / entry["file"], entry)
        return data

    def agent_parts(self, agent: int, step: int) -> int:
        """How many pieces of at most ``step`` bytes :meth:`agent_pieces` yields."""
        return max(1, -(-int(self.manifest["agents"][agent]["bytes"]) // step))

    def agent_pieces(self, agent: int, step: int) -> Iterator[bytes]:
        """Agent ``agent``'s checkpoint read ``step`` bytes at a time, checked against its manifest entry on the
        way: the last piece comes only once the file proved whole (CheckpointUnusable instead), so an agent
        never gets all of a damaged file. One piece is held at a time, not the file (GBs at 10 000 vworkers)."""
        entry = self.manifest["agents"][agent]
        path = self.path / entry["file"]
        (h, want), n = _digest(entry), 0
        try:
            with open(path, "rb") as f:
                piece = f.read(step)
                while True:
                    h.update(piece)
                    n += len(piece)
                    after = f.read(step) if len(piece) == step else b""
                    if not after:
                        break
                    yield piece
                    piece = after
        except OSError as e:
            raise CheckpointUnusable(f"{path} cannot be read ({e.strerror or e})") from e
        if n != entry["bytes"] or h.hexdigest() != want:
            raise CheckpointUnusable(f"{path} is not the file its manifest.json describes ({n} bytes, "
                                     f"{entry['bytes']} expected, or another {h.name.upper()}): truncated or changed")
        yield piece

    @property
    def virtual_time_ns(self) -> int:
        return int(self.manifest["virtual_time_ns"])


class _Crc32:
    """The CRC-32 of a file's bytes, fed piece by piece (``hashlib``'s interface). A checkpoint's checksum
    detects a file truncated or damaged, not one forged (docs/security.md); CRC-32 does that at 2.4x the speed of
    SHA-256 here, and a 10 000-vworker checkpoint is 3.3 GB (docs/benchmarks.md, "Checkpoints the run does not
    wait for the disk")."""

    name = "crc32"

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Any) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def _digest(entry: dict[str, Any]) -> tuple[Any, str]:
    """A fresh digest of the kind ``entry`` records (CRC-32, or SHA-256 in format 1) and the value recorded."""
    if "crc32" in entry:
        return _Crc32(), entry["crc32"]
    return hashlib.sha256(), entry["sha256"]


def _check(path: Path, entry: dict[str, Any]) -> None:
    """:func:`_read_checked` without keeping the bytes: the file is checked a piece at a time."""
    (h, want), n = _digest(entry), 0
    try:
        with open(path, "rb") as f:
            while piece := f.read(16 << 20):
                h.update(piece)
                n += len(piece)
    except OSError as e:
        raise CheckpointUnusable(f"{path} cannot be read ({e.strerror or e})") from e
    if n != entry["bytes"] or h.hexdigest() != want:
        raise CheckpointUnusable(f"{path} is not the file its manifest.json describes ({n} bytes, "
                                 f"{entry['bytes']} expected, or another {h.name.upper()}): truncated or changed")


def _read_checked(path: Path, entry: dict[str, Any]) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointUnusable(f"{path} cannot be read ({e.strerror or e})") from e
    h, want = _digest(entry)
    h.update(data)
    if len(data) != entry["bytes"] or h.hexdigest() != want:
        raise CheckpointUnusable(f"{path} is not the file its manifest.json describes ({len(data)} bytes, "
                                 f"{entry['bytes']} expected, or another {h.name.upper()}): truncated or changed")
    return data


@dataclass(frozen=True)
class Written:
    """An agent's checkpoint already in its file, written while its round came in (:meth:`CheckpointStore.stage`):
    its ``manifest.json`` entry (file, bytes, CRC-32)."""

    entry: dict[str, Any]

    def __len__(self) -> int:
        return int(self.entry["bytes"])


class _Stage:
    """Checkpoint ``window``'s directory while its round comes in: each agent's pieces go to its file as they
    arrive, the CRC-32 taken on the way, so the controller holds none of them (two agents of 10 000 vworkers
    sent 6.4 GB, which it used to hold until the last piece; docs/benchmarks.md). The files are synced and the
    checkpoint committed after the round, as before (:meth:`CheckpointStore._seal`)."""

    COMMITTED = "it is committed already"

    def __init__(self, d: Path):
        self.dir = d
        self.files: dict[int, tuple[Any, _Crc32, str]] = {}
        self.nbytes: dict[int, int] = {}
        self.error: str | None = None  # why the checkpoint cannot be written (a full disk): the round is lost
        if (d / "manifest.json").exists():  # a round asked for it again right after a restore from it: kept
            self.error = self.COMMITTED
            return
        try:
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
        except OSError as e:
            self.error = str(e)

    def write(self, agent: int, piece: Any) -> None:
        """The next piece of ``agent``'s checkpoint."""
        if self.error is not None:
            return
        try:
            if agent not in self.files:
                name = f"agent-{agent}.ckpt"
                # unbuffered: a piece goes to the page cache as it comes (closed in done or abort)
                self.files[agent] = (open(self.dir / name, "wb", buffering=0), _Crc32(), name)  # noqa: SIM115
                self.nbytes[agent] = 0
            f, h, _ = self.files[agent]
            h.update(piece)
            view, off = memoryview(piece).cast("B"), 0
            while off < view.nbytes:  # a raw write may take part of it
                off += f.write(view[off:])
            self.nbytes[agent] += view.nbytes
        except OSError as e:
            self.error = str(e)

    def done(self, agent: int) -> Written | None:
        """``agent``'s last piece is in: its file closed (not yet synced), its manifest entry."""
        if self.error is not None:
            return None
        f, h, name = self.files[agent]  # its pieces came through write, the first of them at least
        try:
            f.close()
        except OSError as e:
            self.error = str(e)
            return None
        return Written({"file": name, "bytes": self.nbytes[agent], "crc32": h.hexdigest()})

    def abort(self) -> None:
        """The round will not commit: its files go (not a checkpoint committed before in that directory)."""
        for f, _, _ in self.files.values():
            try:
                f.close()
            except OSError:
                pass
        if self.error != self.COMMITTED:
            shutil.rmtree(self.dir, ignore_errors=True)


class CheckpointStore:
    """``RUN_DIR/checkpoints``: commit a checkpoint, find the latest, delete them."""

    def __init__(self, run_dir: Path, plan_json: str):
        self.root = Path(run_dir) / DIR_NAME
        self.plan_sha = plan_hash(plan_json)
        self._writer: threading.Thread | None = None
        self._staged: _Stage | None = None  # the round coming in (:meth:`stage`)

    def stage(self, window: int) -> _Stage:
        """Where the agents' checkpoints of ``window`` are written as their pieces come (:class:`Checkpointer`);
        a round left unfinished before (an agent lost meanwhile) is dropped."""
        if self._staged is not None and not (self._staged.dir / "manifest.json").exists():
            self._staged.abort()
        self._staged = _Stage(self.root / str(window))
        return self._staged

    @property
    def busy(self) -> bool:
        """Whether a checkpoint is still being written (the next round waits for it)."""
        return self._writer is not None and self._writer.is_alive()

    def commit_async(self, window: int, virtual_time_ns: int, blobs: dict[int, bytes | Blob],
                     controller: dict[str, Any], summary: dict[str, Any],
                     done: Callable[[Path | None, float, float], None]) -> None:
        """:meth:`commit` on a thread of its own, so the window loop goes on reading the agents (their
        inboxes are bounded); ``done(directory or None, wall seconds, wall seconds the run waited)`` after it."""
        self.wait()
        controller_bytes = pickle.dumps(controller, protocol=pickle.HIGHEST_PROTOCOL)  # now: the state of now
        self._writer = threading.Thread(
            target=self._write, name=f"checkpoint-{window}", daemon=True,
            args=(window, lambda: self._files(window, blobs, controller_bytes), virtual_time_ns, summary, done))
        self._writer.start()

    def commit_now(self, window: int, virtual_time_ns: int, blobs: dict[int, bytes | Blob],
                   controller: dict[str, Any], summary: dict[str, Any],
                   done: Callable[[Path | None, float, float], None]) -> None:
        """:meth:`commit_async` for blobs that view memory the run changes once it goes on (``Blob.live``:
        in-process cores, whose tensors are then not copied): their bytes are in the files — the kernel's page
        cache, a copy — before it returns; syncing them to the disk and the commit happen on a thread, so the
        run waits for a memory copy, not for the disk."""
        self.wait()
        t0 = time.perf_counter()
        try:
            files = self._files(window, blobs, pickle.dumps(controller, protocol=pickle.HIGHEST_PROTOCOL))
        except OSError as e:
            log.warning("could not write checkpoint %d: %s", window, e)
            took = time.perf_counter() - t0
            done(None, took, took)
            return
        self._writer = threading.Thread(target=self._write, name=f"checkpoint-{window}", daemon=True,
                                        args=(window, lambda: files, virtual_time_ns, summary, done, t0,
                                              time.perf_counter() - t0))
        self._writer.start()

    def _write(self, window: int, files: Callable[[], _Files], virtual_time_ns: int, summary: dict[str, Any],
               done: Callable[[Path | None, float, float], None], t0: float | None = None,
               waited: float = 0.0) -> None:
        """On the writer thread: the files (written by ``files()``, or already), synced and committed; then
        ``done``. ``t0``: when the checkpoint began, if before this thread; ``waited``: how long the run waited."""
        t0 = time.perf_counter() if t0 is None else t0
        try:
            d = self._seal(files(), virtual_time_ns, summary)
        except OSError as e:  # a full disk: the run goes on; recovery uses the last good checkpoint
            log.warning("could not write checkpoint %d: %s", window, e)
            d = None
        done(d, time.perf_counter() - t0, waited)

    def wait(self) -> None:
        """Until the checkpoint being written (if any) is committed."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    def commit(self, window: int, virtual_time_ns: int, blobs: dict[int, bytes | Blob],
               controller: dict[str, Any] | bytes, summary: dict[str, Any]) -> Path:
        """Write checkpoint ``window`` and make it the latest; returns its directory."""
        state = controller if isinstance(controller, bytes) else pickle.dumps(controller,
                                                                              protocol=pickle.HIGHEST_PROTOCOL)
        return self._seal(self._files(window, blobs, state), virtual_time_ns, summary)

    def _files(self, window: int, blobs: dict[int, bytes | Blob | Written], state: bytes) -> _Files:
        """Write the checkpoint's files, not yet synced; each file's manifest entry (size and CRC-32). Agents'
        checkpoints already :class:`Written` (:meth:`stage`) are in the directory: only their entries are taken."""
        d = self.root / str(window)
        if not any(isinstance(b, Written) for b in blobs.values()):
            if d.exists():
                shutil.rmtree(d)
            d.mkdir(parents=True)
        agents = []
        for a in range(len(blobs)):
            if isinstance(blobs[a], Written):
                agents.append(dict(blobs[a].entry))
                continue
            name = f"agent-{a}.ckpt"
            agents.append({"file": name, "bytes": len(blobs[a]), "crc32": _write_summed(d / name, blobs[a])})
        controller = {"file": "controller.pkl", "bytes": len(state), "crc32": _write_summed(d / "controller.pkl",
                                                                                           state)}
        return _Files(window, d, agents, controller)

    def _seal(self, files: _Files, virtual_time_ns: int, summary: dict[str, Any]) -> Path:
        """Sync the files to the disk, then write the manifest, then name the checkpoint ``latest``: the
        commit (written, then renamed over the old); older checkpoints are deleted then."""
        d, window = files.dir, files.window
        for entry in (*files.agents, files.controller):
            _sync(d / entry["file"])
        manifest = {"format": FORMAT, "window": window, "virtual_time_ns": virtual_time_ns,
                    "plan_sha256": self.plan_sha, "agents": files.agents, "controller": files.controller,
                    "wall_clock": time.time(), **summary}
        write_atomic(d / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        write_atomic(self.root / "latest", f"{window}\n")
        for old in self.root.iterdir():
            if old.is_dir() and old.name != str(window):
                shutil.rmtree(old, ignore_errors=True)
        return d

    def latest(self) -> Checkpoint | None:
        """The latest committed checkpoint, verified (None: there is none); CheckpointUnusable if it is bad."""
        self.wait()
        pointer = self.root / "latest"
        if not pointer.exists():
            return None
        try:
            window = int(pointer.read_text().strip())
        except (OSError, ValueError) as e:
            raise CheckpointUnusable(f"{pointer} does not name a checkpoint ({e})") from e
        d = self.root / str(window)
        try:
            manifest = json.loads((d / "manifest.json").read_text())
        except (OSError, ValueError) as e:
            raise CheckpointUnusable(f"{d / 'manifest.json'} cannot be read ({e})") from e
        if not isinstance(manifest, dict) or manifest.get("format") not in READABLE \
                or manifest.get("window") != window:
            raise CheckpointUnusable(f"{d / 'manifest.json'} is not a manifest of checkpoint {window} "
                                     f"in format {' or '.join(map(str, READABLE))}")
        if manifest.get("plan_sha256") != self.plan_sha:
            raise CheckpointUnusable(f"checkpoint {window} was taken with another plan (plan.json differs)")
        try:
            for entry in manifest["agents"]:
                _check(d / entry["file"], entry)  # every file now: a bad one must not cost a restart
            state = pickle.loads(_read_checked(d / "controller.pkl", manifest["controller"]))  # noqa: S301
        except CheckpointUnusable:
            raise
        except Exception as e:  # noqa: BLE001 - a manifest of the wrong shape, an unreadable pickle
            raise CheckpointUnusable(f"checkpoint {window} in {d} cannot be read ({type(e).__name__}: {e})") from e
        return Checkpoint(window, d, manifest, state)

    def committed(self) -> bool:
        """Whether a checkpoint was committed (once the one being written, if any, is)."""
        self.wait()
        return (self.root / "latest").exists()

    def clear(self) -> None:
        """A complete run needs no recovery data."""
        self.wait()
        if self._staged is not None:
            self._staged.abort()
            self._staged = None
        shutil.rmtree(self.root, ignore_errors=True)


def _write_summed(path: Path, data: bytes | Blob) -> str:
    """Write ``data`` to ``path`` (not synced: :func:`_sync`); returns its CRC-32, taken piece by piece as each
    is written (while the piece is still in the CPU's cache: one pass over the bytes, not two)."""
    h = _Crc32()
    with open(path, "wb") as f:
        for piece in data.pieces if isinstance(data, Blob) else (data,):
            h.update(piece)
            f.write(piece)
    return h.hexdigest()


def _sync(path: Path) -> None:
    """Until the bytes written to ``path`` are on the disk (fsync, through a descriptor of its own)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _Files:
    """A checkpoint's files, written but not yet committed (:meth:`CheckpointStore._seal`)."""

    window: int
    dir: Path
    agents: list[dict[str, Any]]
    controller: dict[str, Any]


@dataclass
class _Round:
    window: int
    ids: dict[int, int]  # agent -> call id
    parts: dict[int, list[bytes]] = field(default_factory=dict)  # without a stage: the pieces, held
    counts: dict[int, int] = field(default_factory=dict)  # pieces in, per agent
    done: dict[int, Any] = field(default_factory=dict)  # agents whose checkpoint is complete (Written, or held)
    stage: _Stage | None = None  # where the pieces go as they come (CheckpointStore.stage)
    answered: set[int] = field(default_factory=set)
    failed: str | None = None  # why this round will not commit
    asked_at: float = field(default_factory=time.monotonic)


class Checkpointer:
    """The controller's side of checkpoints with direct windows (driven by :func:`controller.mesh.run_direct`).

    ``commit(window, blobs, view)`` is called when every agent's checkpoint of ``window`` is in and the
    collector holds exactly the rows before it; ``view`` is run_direct's own state at that moment.
    """

    def __init__(self, every_s: float, commit: Callable[[int, dict[int, Any], dict[str, Any]], None],
                 busy: Callable[[], bool] = lambda: False, stage: Callable[[int], _Stage] | None = None):
        """``stage(window)``: where an agent's pieces are written as they come (:meth:`CheckpointStore.stage`),
        committed as :class:`Written`; without it the pieces are held and committed as a :class:`Blob` each.
        An in-process agent's whole Blob (views of its live core) is committed as it is either way."""
        self.every_s = every_s
        self._commit = commit
        self._busy = busy  # the last checkpoint is still being written
        self._stage = stage
        self.enabled = every_s > 0
        self.spacing = every_s  # wall seconds from one round to the next: every_s, or more after a costly one
        self.gathered_s = 0.0  # wall seconds the last round took, from asking to the last piece
        self.round: _Round | None = None
        self.slack = FIRST_SLACK
        self._last = time.monotonic()
        self._refusal: tuple[str, int] = ("", 0)
        self.gave_up: str | None = None  # why this run takes no checkpoints (said once, kept across restarts)

    def give_up(self, reason: str, said: bool = False) -> None:
        """Take no checkpoints in this run, and say why once (``said``: the Checkpointer of the agents before a
        restart said it already)."""
        if self.gave_up is None and not said:
            log.warning("no checkpoints in this run: %s; a lost agent makes the run replay from virtual "
                        "time 0 (docs/recovery.md)", reason)
        self.gave_up = reason
        self.enabled = False

    # ---------------------------------------------------------------- asking
    def due(self, furthest: int, exact: bool = False) -> int | None:
        """The window to ask for now (None: not now): ``furthest`` + a slack, or ``furthest`` itself when
        ``exact`` (the controller's own loop, between two windows)."""
        if not self.enabled or self.round is not None or time.monotonic() - self._last < self.spacing \
                or self._busy():
            return None
        return furthest if exact else furthest + self.slack

    def written(self, seconds: float) -> None:
        """The last checkpoint took ``seconds`` to write, after its round took :attr:`gathered_s` (the agents'
        snapshots and their pieces' way here): space the next ones so that taking them costs at most about
        1/COST_SHARE of the wall time (a 10 000-vworker run's 3.3 GB took 9.9 s to write: 99 s apart, and more
        for the time its round took)."""
        self.spacing = max(self.every_s, COST_SHARE * (self.gathered_s + seconds))

    def asked(self, window: int, ids: dict[int, int]) -> None:
        self.round = _Round(window, ids, stage=self._stage(window) if self._stage is not None else None)
        self._last = time.monotonic()

    # -------------------------------------------------------------- answers
    def is_answer(self, agent: int, reply_id: int) -> bool:
        r = self.round
        return r is not None and r.ids.get(agent) == reply_id and agent not in r.answered

    def holding(self, agent: int) -> bool:
        """Whether the controller must not read more of ``agent`` (its checkpoint is in, others' are not)."""
        r = self.round
        return r is not None and r.failed is None and agent in r.done

    def answer(self, agent: int, value: Any) -> str:
        """One reply frame of ``agent``; returns its status. Raises ValueError for a malformed one."""
        r = self.round
        if not (isinstance(value, tuple) and len(value) == 5):
            raise ValueError(f"expected (status, window, part, parts, data), got {type(value).__name__}")
        status, window, part, parts, data = value
        if window != r.window or not isinstance(part, int) or not isinstance(parts, int) or not 0 <= part < parts:
            raise ValueError(f"an answer for window {window!r}, part {part!r} of {parts!r} (asked: {r.window})")
        if status == "ok":
            if not isinstance(data, (bytes, Blob)):  # a Blob: an in-process agent's, whole
                raise ValueError("a checkpoint piece that is not bytes")
            if part != r.counts.get(agent, 0):
                raise ValueError(f"checkpoint piece {part} after {r.counts.get(agent, 0)}")
            r.counts[agent] = part + 1
            if r.stage is not None and not isinstance(data, Blob):
                r.stage.write(agent, data)
                if part < parts - 1:
                    return "partial"
                r.done[agent] = r.stage.done(agent)
            else:
                got = r.parts.setdefault(agent, [])
                got.append(data)
                if part < parts - 1:
                    return "partial"
                got = r.parts.pop(agent)
                r.done[agent] = got[0] if len(got) == 1 else Blob(got)  # written piece by piece, never joined
        elif status in ("missed", "ended", "refused", "refused_permanent"):
            if r.failed is None:
                r.failed = status
            if status == "missed":
                self.slack = min(self.slack * 2, 1 << 20)
            elif status == "ended":
                self.enabled = False
            else:
                self._refused(str(data), status == "refused_permanent")
        else:
            raise ValueError(f"unknown checkpoint status {status!r}")
        r.answered.add(agent)
        return status

    def _refused(self, reason: str, permanent: bool) -> None:
        same = self._refusal[1] + 1  # refusals in a row (their sentences may name other vworkers)
        self._refusal = (reason, same)
        if permanent or same >= REFUSALS_BEFORE_GIVING_UP:
            self.give_up(reason)
        elif same == 1:
            log.info("no checkpoint this time: %s", reason)

    def complete(self) -> bool:
        r = self.round
        return r is not None and len(r.answered) == len(r.ids)

    def finish(self, view: dict[str, Any]) -> bool:
        """Every agent answered: commit (when all sent their checkpoint); True when one was committed."""
        r, self.round = self.round, None
        self._last = time.monotonic()
        if r is not None:
            self.gathered_s = self._last - r.asked_at
        if r is not None and r.failed == "missed":  # ask again at once, further ahead
            self._last -= self.spacing
        if r is not None and r.failed is None and r.stage is not None and r.stage.error is not None:
            log.log(logging.INFO if r.stage.error == _Stage.COMMITTED else logging.WARNING,
                    "could not write checkpoint %d: %s", r.window, r.stage.error)
            r.failed = "unwritten"
        if r is not None and r.failed is not None and r.stage is not None:
            r.stage.abort()
        if r is None or r.failed is not None:
            return False
        self._refusal = ("", 0)
        self._commit(r.window, r.done, view)
        return True
