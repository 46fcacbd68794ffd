"""The state log: every model exchange of every vworker, to inspect a run at any virtual time.

This is the log-structure of the FL-timing thesis (§5.2, "State Model"): a
mapping from each client to its list of states, one per exchange with the
server. State ``S_i^j`` of worker ``i``, exchange ``j``, holds

* ``begin_ns`` — when the worker received the server's model, with the model
  version ("server age") and its checksum;
* ``sent_ns`` — when the worker handed its result to the network
  (``sent_ns - begin_ns`` is the thesis's training time ``t_c`` when the worker
  sends right after computing), and its training loss;
* ``end_ns`` — when the server received the result, with the server's version
  at that moment;
* ``applied_ns``/``applied_version``/``staleness`` — when the server applied it,
  the version that made, its checksum, and the staleness the server counted.

Strategies write three kinds of records through ``Recorder.event`` (so they
travel with the window's rows over any transport; see :func:`log_model`,
:func:`log_result`, :func:`log_version`); the controller's
:class:`StateLogWriter` sorts them into ``statelog.jsonl`` (one JSON object per
line: ``t``, ``vworker``, ``kind`` and the fields), saving parameter snapshots
(``statelog.snapshot_every``) to ``snapshots/``; :class:`StateLog` reads them
back and answers "what did this vworker hold at time T".

The parameters themselves are not logged, only a CRC-32 of their bytes (enough
to tell two models apart, and cheap: one pass over the tensor per version).

A strategy may add records of its own kind — ``self.env.recorder.event(self, "rtt", ns=...)`` — which
reach ``statelog.jsonl`` the same way, from any agent; :func:`agents.sim.records.check_custom_record` says
what such a record may hold (docs/strategies.md, "Records of your own").
"""
from __future__ import annotations

import bisect
import json
import os
import re
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.sim.types import VirtualTime

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.worker import Message, Worker

__all__ = ["Exchange", "KINDS", "StateLog", "StateLogWriter", "checksum", "log_model", "log_result",
           "log_version", "StatelogSpec", "snapshot_path", "read_jsonl"]

KINDS = ("state.model", "state.result", "state.version")
LOG_NAME = "statelog.jsonl"
SNAPSHOT_DIR = "snapshots"


@dataclass(frozen=True)
class StatelogSpec:
    """What an agent records for statelog.jsonl (``Plan.statelog``); disabled unless the observer asks."""

    enabled: bool = False
    checksum: bool = True
    snapshot_every: int = 0


_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def snapshot_path(run_dir: str | os.PathLike[str], vworker: str, version: int) -> Path:
    """``run_dir/snapshots/<vworker>-v<version>.pt``; ValueError for a name or version that could leave it."""
    if not isinstance(vworker, str) or not _SAFE_NAME.fullmatch(vworker) or type(version) is not int \
            or version < 0:
        raise ValueError(f"snapshot of vworker {vworker!r:.60} version {version!r:.20}: a vworker name is letters, "
                         "digits, '_', '.', '-' (not starting with '.' or '-'), a version an integer >= 0")
    d = (Path(run_dir) / SNAPSHOT_DIR).resolve()
    path = (d / f"{vworker}-v{version:08d}.pt").resolve()
    if path.parent != d:  # belt and braces: the pattern already keeps it in d
        raise ValueError(f"snapshot of vworker {vworker!r} would leave {d}")
    return path


def read_jsonl(path: str | os.PathLike[str]) -> list[Any]:
    """The JSON values of a file written one per line; a last line cut short (the writer was killed
    mid-write) is left out, a bad line before it is an error naming the file and line."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError as e:
            if i == len(lines) - 1:  # no newline after it: torn
                break
            raise ValueError(f"{path}, line {i + 1}: not a JSON value ({e})") from e
    return out


def checksum(tensor: Any) -> str:
    """CRC-32 (8 hex digits) of a tensor's bytes, as they are in memory on the CPU."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    arr = t.contiguous().numpy()
    return f"{zlib.crc32(memoryview(arr).cast('B')):08x}"


def _settings(w: "Worker") -> StatelogSpec | None:
    s = w.env.statelog
    return s if s is not None and s.enabled else None


def log_model(w: "Worker", msg: "Message", version: int) -> None:
    """Worker side: ``w`` received model ``version`` from ``msg.src`` now (the exchange begins)."""
    if _settings(w) is not None:
        w.env.recorder.event(w, "state.model", server=msg.src, version=int(version))


def log_result(server: "Worker", msg: "Message", version: int, loss: float, staleness: int,
               applied_version: int) -> None:
    """Server side: the result of ``msg.src``, computed on ``version``, was applied now and made
    ``applied_version`` (the exchange ends)."""
    if _settings(server) is not None:
        server.env.recorder.event(server, "state.result", worker=msg.src, version=int(version),
                                  sent_ns=msg.sent_at, delivered_ns=msg.delivered_at, loss=float(loss),
                                  staleness=int(staleness), applied_version=int(applied_version))


def log_version(server: "Worker", version: int, params: Any) -> None:
    """Server side: the global model is now ``version`` with flat ``params`` (a checksum, maybe a snapshot).

    ``params`` may be a callable returning the tensor, called only when the log is on.
    """
    s = _settings(server)
    if s is None:
        return
    if callable(params):
        params = params()
    fields: dict[str, Any] = {"version": int(version)}
    if s.checksum:
        fields["crc"] = checksum(params)
    every = s.snapshot_every
    if every and version % every == 0:
        fields["params"] = params.detach().cpu().clone()
    server.env.recorder.event(server, "state.version", **fields)


# ------------------------------------------------------------------ writing
class StateLogWriter:
    """Controller side: collects state records and streams ``statelog.jsonl`` (+ ``snapshots/``) to disk.

    Rows are appended, sorted, as soon as they are final (:meth:`flush`, after every window, like the
    rows of ``metrics.csv``), so a controller killed mid-run leaves the log up to its last window; a
    reader skips a last line cut in half (:meth:`StateLog.load`).
    """

    def __init__(self, run_dir: str | os.PathLike[str]):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOG_NAME
        self.rows: list[tuple] = []  # not yet final
        self.snapshots = 0
        self._f: Any = None

    def add(self, key: tuple, kind: str, vworker: str, fields: dict[str, Any]) -> None:
        params = fields.get("params") if kind == "state.version" else None  # (a strategy's record may say params)
        if params is not None:
            import torch

            path = snapshot_path(self.run_dir, vworker, fields["version"])
            path.parent.mkdir(exist_ok=True)
            torch.save({"version": fields["version"], "virtual_time_ns": key.time, "vworker": vworker,
                        "params": params}, path)
            self.snapshots += 1
            fields = {k: v for k, v in fields.items() if k != "params"}
        self.rows.append((key, kind, vworker, fields))

    def _write(self, rows: list[tuple]) -> None:
        if self._f is None:
            self._f = open(self.path, "w")
        for key, kind, name, fields in rows:
            self._f.write(json.dumps({"t": key.time, "vworker": name, "kind": kind.removeprefix("state."),
                                      **fields}, separators=(",", ":")) + "\n")
        self._f.flush()

    def flush(self, before: VirtualTime) -> None:
        """Write the rows before ``before`` (final: no later window can add an earlier one)."""
        self.rows.sort(key=lambda r: r[0])
        cut = bisect.bisect_left(self.rows, before, key=lambda r: r[0].time)
        if cut:
            self._write(self.rows[:cut])
            del self.rows[:cut]

    def close(self, stop_time: VirtualTime | None = None) -> Path:
        """Write the rest, sorted by (time, vworker id, record counter), leaving out rows past ``stop_time``."""
        self.rows.sort(key=lambda r: r[0])
        self._write([r for r in self.rows if stop_time is None or r[0].time <= stop_time])
        self.rows = []
        self._f.close()
        return self.path


# ------------------------------------------------------------------ reading
@dataclass
class Exchange:
    """One state ``S_i^j`` of the thesis: worker ``i``'s ``j``-th exchange with ``server``."""

    worker: str
    index: int
    server: str
    begin_ns: VirtualTime
    version: int
    crc: str | None
    sent_ns: VirtualTime | None = None
    end_ns: VirtualTime | None = None
    server_version_at_end: int | None = None
    loss: float | None = None
    staleness: int | None = None
    applied_ns: VirtualTime | None = None
    applied_version: int | None = None
    applied_crc: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class StateLog:
    """The thesis's mapping vworker -> list of states, read from a run directory."""

    def __init__(self, rows: Iterable[dict[str, Any]], run_dir: Path | None = None):
        self.run_dir = run_dir
        self.versions: dict[str, list[tuple[int, int, str | None]]] = {}  # server -> [(t, version, crc)]
        self.exchanges: dict[str, list[Exchange]] = {}
        self.crashes: dict[str, list[tuple[int, int | None]]] = {}  # vworker -> [(crash t, until or None)]
        pending: dict[tuple[str, str, int], Exchange] = {}
        results = []
        for r in rows:
            kind = r["kind"]
            if kind == "version":
                self.versions.setdefault(r["vworker"], []).append((r["t"], r["version"], r.get("crc")))
            elif kind == "model":
                ex_list = self.exchanges.setdefault(r["vworker"], [])
                ex = Exchange(r["vworker"], len(ex_list), r["server"], r["t"], r["version"], None)
                ex_list.append(ex)
                pending[(r["vworker"], r["server"], r["version"])] = ex
            elif kind == "result":
                results.append(r)
            elif kind == "fault.crash":  # (agents/sim/faults.py)
                self.crashes.setdefault(r["vworker"], []).append((r["t"], r["until"]))
        for r in results:
            ex = pending.pop((r["worker"], r["vworker"], r["version"]), None)
            if ex is None:
                continue  # a result whose model event is missing (the log was cut): nothing to join
            ex.sent_ns, ex.end_ns, ex.loss = r["sent_ns"], r["delivered_ns"], r["loss"]
            ex.staleness, ex.applied_ns, ex.applied_version = r["staleness"], r["t"], r["applied_version"]
        self._times = {s: [v[0] for v in vs] for s, vs in self.versions.items()}
        crc = {(s, v[1]): v[2] for s, vs in self.versions.items() for v in vs}
        for exs in self.exchanges.values():
            for ex in exs:
                ex.crc = crc.get((ex.server, ex.version))
                if ex.end_ns is not None:
                    ex.server_version_at_end = self.version_at(ex.server, ex.end_ns)
                    ex.applied_crc = crc.get((ex.server, ex.applied_version))

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str]) -> "StateLog":
        run_dir = Path(run_dir)
        path = run_dir / LOG_NAME
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist: the run was made with statelog.enabled=false "
                                    "or has not finished")
        return cls(read_jsonl(path), run_dir)

    @property
    def servers(self) -> list[str]:
        return sorted(self.versions)

    def version_at(self, server: str, t: VirtualTime) -> int | None:
        """The server's model version at time ``t`` (updates at ``t`` included); None before any."""
        i = bisect.bisect_right(self._times.get(server, []), t)
        return None if i == 0 else self.versions[server][i - 1][1]

    def version_record_at(self, server: str, t: VirtualTime) -> tuple[int, int, str | None] | None:
        i = bisect.bisect_right(self._times.get(server, []), t)
        return None if i == 0 else self.versions[server][i - 1]

    def down_at(self, worker: str, t: VirtualTime) -> tuple[int, int | None] | None:
        """The crash ``(at, until)`` the vworker is down in at ``t`` (``[at, until)``; until None: for
        good); None when it is up."""
        for at, until in self.crashes.get(worker, ()):
            if at <= t and (until is None or t < until):
                return at, until
        return None

    def exchange_at(self, worker: str, t: VirtualTime) -> Exchange | None:
        """The worker's exchange in progress at ``t``: the last one that began at or before ``t``."""
        exs = self.exchanges.get(worker, [])
        i = bisect.bisect_right([e.begin_ns for e in exs], t)
        return None if i == 0 else exs[i - 1]

    def last_applied(self, worker: str, t: VirtualTime) -> Exchange | None:
        """The worker's latest exchange the server had applied by ``t``."""
        best = None
        for ex in self.exchanges.get(worker, []):
            if ex.applied_ns is not None and ex.applied_ns <= t:
                best = ex
        return best

    def snapshot_at(self, server: str, t: VirtualTime) -> Path | None:
        """The newest parameter snapshot of ``server`` taken at or before ``t``."""
        if self.run_dir is None:
            return None
        best = None
        for vt, version, _ in self.versions.get(server, []):
            if vt > t:
                break
            try:
                p = snapshot_path(self.run_dir, server, version)
            except ValueError:
                continue
            if p.exists():
                best = p
        return best
