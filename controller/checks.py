"""What an agent reports, checked against the plan before the controller writes or keeps any of it.

An agent holds the run's token, but it may still be buggy or hostile (docs/security.md): every row
of a ``Reached`` must name a vworker *this* agent hosts, carry the plan's name for it and have the
shape and types its writer expects. The rows then reach ``metrics.csv``, ``eval.csv``, the trace
and the state log (whose snapshots are files named after the vworker) — nothing an agent says
chooses a path, a column count or a size the plan did not.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from agents.common.plan import Plan
from agents.observe.trace import TRACE_KIND
from agents.sim.faults import FAULT_RECORDS
from agents.sim.records import check_custom_record
from agents.workloads.datanet import FETCH_KIND

__all__ = ["RowError", "check_rows", "STATE_FIELDS"]

_INT64 = (-(1 << 63), (1 << 63) - 1)
_MAX_STR = 256

# state-log kinds (agents/observe/statelog.py) and the fields each may carry: name -> accepted types
_NUM = (int, float)
STATE_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "state.model": {"server": (str,), "version": (int,)},
    "state.result": {"worker": (str,), "version": (int,), "sent_ns": (int,), "delivered_ns": (int,),
                     "loss": _NUM, "staleness": (int,), "applied_version": (int,)},
    "state.version": {"version": (int,), "crc": (str,), "params": (torch.Tensor,)},
}
_NAMES_FIELDS = {"server", "worker"}  # fields that name a vworker


class RowError(ValueError):
    """A row an agent reported does not match the plan; the message is one sentence."""


_FETCH_FIELDS = {"hits", "misses", "bytes", "wait_ns"}


def _is_int(x: Any) -> bool:
    return type(x) is int and _INT64[0] <= x <= _INT64[1]


def _is_num(x: Any) -> bool:
    return _is_int(x) or type(x) is float


def _key(key: Any, plan: Plan, agent_id: int, what: str) -> int:
    """The vworker id of a row key ``(t, vworker id, n)``; it must be hosted by ``agent_id``."""
    if not (type(key) is tuple and len(key) == 3 and all(_is_int(k) for k in key)):
        raise RowError(f"{what}: a row key must be (time, vworker id, counter) of integers, got {key!r:.80}")
    vid = key[1]
    if not 0 <= vid < len(plan.placement) or plan.placement[vid] != agent_id:
        raise RowError(f"{what}: a row for vworker id {vid}, which this agent does not host")
    if key[0] < 0:
        raise RowError(f"{what}: a row at negative virtual time {key[0]}")
    return vid


def _table_rows(rows: Any, plan: Plan, agent_id: int, what: str, types: Sequence[tuple[type, ...]]) -> None:
    if type(rows) is not list:
        raise RowError(f"{what} must be a list of (key, row) tuples")
    for item in rows:
        if not (type(item) is tuple and len(item) == 2 and type(item[1]) is tuple):
            raise RowError(f"{what} must be a list of (key, row) tuples")
        key, row = item
        vid = _key(key, plan, agent_id, what)
        if len(row) != len(types) or not all(type(v) in ts and (type(v) is not int or _is_int(v))
                                             for v, ts in zip(row, types)):
            raise RowError(f"{what}: a row of {len(row)} values does not match the {len(types)} columns "
                           f"({', '.join('/'.join(t.__name__ for t in ts) for ts in types)})")
        if row[0] != key[0] or row[2] != plan.names[vid]:
            raise RowError(f"{what}: a row for {row[2]!r:.40} at {row[0]} under the key of vworker "
                           f"{plan.names[vid]!r} at {key[0]}")


_UPDATE = ((int,), (float,), (str,), (int,), (float,), (int,), (int,), (int,), (float,))
_EVAL = ((int,), (float,), (str,), (int,), (float,), (float,), (float,))


def _trace_record(rec: Any, vid: int, plan: Plan, what: str) -> None:
    n = len(plan.placement)
    if type(rec) is not tuple or not rec:
        raise RowError(f"{what}: a trace record must be a tuple")
    if rec[0] == "c":
        ok = (len(rec) == 5 and rec[1] == vid and type(rec[2]) is str and len(rec[2]) <= _MAX_STR
              and _is_int(rec[3]) and _is_int(rec[4]) and 0 <= rec[3] <= rec[4])
    elif rec[0] == "m":
        ok = (len(rec) == 11 and all(_is_int(x) for x in rec[1:4] + rec[5:11]) and rec[2] == vid
              and 0 <= rec[1] < n and (rec[4] is None or (type(rec[4]) is str and len(rec[4]) <= _MAX_STR)
                                        or _is_int(rec[4])))
    else:
        ok = False
    if not ok:
        raise RowError(f"{what}: a malformed trace record {rec!r:.80} for vworker {plan.names[vid]!r}")


def _state_fields(kind: str, fields: Any, plan: Plan, what: str, max_tensor_bytes: int) -> None:
    allowed = STATE_FIELDS[kind]
    if type(fields) is not dict or not set(fields) <= set(allowed) or "version" not in fields:
        raise RowError(f"{what}: a {kind} record must hold the fields {sorted(allowed)} (version required), "
                       f"got {sorted(map(str, fields)) if type(fields) is dict else type(fields).__name__}")
    names = plan.name_set
    for k, v in fields.items():
        if type(v) not in allowed[k] or (type(v) is int and not _is_int(v)):
            raise RowError(f"{what}: {kind} field {k!r} is a {type(v).__name__}")
        if type(v) is float and not math.isfinite(v) and k != "loss":
            raise RowError(f"{what}: {kind} field {k!r} is {v}")
        if type(v) is str and (len(v) > _MAX_STR or (k in _NAMES_FIELDS and v not in names)):
            raise RowError(f"{what}: {kind} field {k!r} names {v!r:.40}, not a vworker of this run")
    if fields["version"] < 0:
        raise RowError(f"{what}: {kind} version {fields['version']} is negative")
    p = fields.get("params")
    if p is not None and (not p.is_floating_point() or p.dim() != 1
                          or p.numel() * p.element_size() > max_tensor_bytes):
        raise RowError(f"{what}: a state.version snapshot must be a flat float tensor of at most "
                       f"{max_tensor_bytes} bytes, got {p.dtype} of shape {list(p.shape)}")


def _fault_fields(kind: str, fields: Any, vid: int, plan: Plan) -> None:
    """A ``fault.crash`` or ``fault.recover`` record: exactly its fields, of their types, and only for a
    vworker the plan's faults crash."""
    allowed = FAULT_RECORDS[kind]
    if type(fields) is not dict or set(fields) != set(allowed):
        raise RowError(f"events: a {kind} record must hold exactly the fields {sorted(allowed)}, got "
                       f"{sorted(map(str, fields)) if type(fields) is dict else type(fields).__name__}")
    for k, v in fields.items():
        if type(v) not in allowed[k] or (type(v) is int and not (_is_int(v) and v >= 0)):
            raise RowError(f"events: {kind} field {k!r} is {v!r:.40}")
    if not any(vid in f.vworkers for f in plan.faults.of_kind("crash")):
        raise RowError(f"events: a {kind} record for {plan.names[vid]!r}, which no crash fault of the plan hits")


def check_rows(plan: Plan, agent_id: int, updates: Any, evals: Any, events: Any,
               max_tensor_bytes: int) -> None:
    """Raise RowError unless every row names a vworker ``agent_id`` hosts and has its writer's shape."""
    _table_rows(updates, plan, agent_id, "updates", _UPDATE)
    _table_rows(evals, plan, agent_id, "evals", _EVAL)
    if type(events) is not list:
        raise RowError("events must be a list of (key, kind, vworker, fields)")
    for item in events:
        if not (type(item) is tuple and len(item) == 4):
            raise RowError("events must be a list of (key, kind, vworker, fields)")
        key, kind, name, fields = item
        vid = _key(key, plan, agent_id, "events")
        if name != plan.names[vid]:
            raise RowError(f"events: a record names {name!r:.40} under the key of vworker {plan.names[vid]!r}")
        if kind == TRACE_KIND:
            _trace_record(fields, vid, plan, "events")
        elif kind in STATE_FIELDS:
            _state_fields(kind, fields, plan, "events", max_tensor_bytes)
        elif kind in FAULT_RECORDS:  # a crash and its recovery (agents/sim/faults.py)
            _fault_fields(kind, fields, vid, plan)
        elif kind == FETCH_KIND:  # data.placement=end_devices (agents/workloads/datanet.py)
            if not (type(fields) is dict and set(fields) == _FETCH_FIELDS
                    and all(_is_int(v) and v >= 0 for v in fields.values())):
                raise RowError(f"events: a {FETCH_KIND} record must hold the non-negative integers "
                               f"{sorted(_FETCH_FIELDS)}")
        else:  # a strategy's own record (docs/strategies.md, "Records of your own")
            try:
                check_custom_record(kind, fields)
            except ValueError as e:
                raise RowError(f"events: {e}") from None
