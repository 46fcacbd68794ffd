"""Records a vworker writes through ``Recorder.event`` (agents/sim/env.py): lockstep's own kinds, and what a
strategy's own record may hold (docs/strategies.md, "Records of your own").

They reach ``statelog.jsonl`` from any agent (agents/observe/statelog.py); the controller checks every record an
agent process reports (controller/checks.py). Here, in the engine, so that the recorder can check a strategy's
record where its author makes it.
"""
from __future__ import annotations

import re
from typing import Any

__all__ = ["OWN_KINDS", "RESERVED_KINDS", "check_custom_record"]

RESERVED_KINDS = ("trace", "state.", "fault.", "data.")  # lockstep's own records (a kind or a prefix)
# lockstep's own kinds (controller/checks.py checks each; tests/security/test_network.py keeps the two in step)
OWN_KINDS = frozenset({"trace", "state.model", "state.result", "state.version", "fault.crash", "fault.recover",
                       "data.fetch"})
_CUSTOM_KIND = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")
_CUSTOM_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LINE_KEYS = frozenset({"t", "vworker", "kind"})  # what every statelog.jsonl line holds already
CUSTOM_MAX_FIELDS, CUSTOM_MAX_NAME, CUSTOM_MAX_STR = 32, 64, 256


def check_custom_record(kind: Any, fields: Any) -> None:
    """Raise ValueError (one sentence) unless ``kind``/``fields`` make a record a strategy may write itself:
    a kind of letters, digits, ``_`` and dots that is not lockstep's own, and at most 32 fields named like
    identifiers (not ``t``, ``vworker`` or ``kind``) whose values are None, booleans, 64-bit integers, finite
    floats or strings of at most 256 characters — what a JSON line holds, the same from any agent."""
    if type(kind) is not str or len(kind) > CUSTOM_MAX_NAME or not _CUSTOM_KIND.fullmatch(kind) \
            or kind == "trace" or kind.startswith(RESERVED_KINDS[1:]):
        raise ValueError(f"record kind {kind!r:.80} is not valid; accepted: a name of letters, digits, '_' and "
                         f"'.' of at most {CUSTOM_MAX_NAME} characters that is not lockstep's own (trace, state.*, "
                         "fault.*, data.*)")
    if type(fields) is not dict or len(fields) > CUSTOM_MAX_FIELDS:
        raise ValueError(f"a {kind} record holds at most {CUSTOM_MAX_FIELDS} fields")
    for k, v in fields.items():
        if type(k) is not str or len(k) > CUSTOM_MAX_NAME or not _CUSTOM_FIELD.fullmatch(k) or k in _LINE_KEYS:
            raise ValueError(f"a {kind} record's field name {k!r:.80} is not valid; accepted: an identifier of at "
                             f"most {CUSTOM_MAX_NAME} characters other than t, vworker and kind")
        ok = (v is None or type(v) is bool or (type(v) is int and -(1 << 63) <= v < 1 << 63)
              or (type(v) is float and v == v and abs(v) != float("inf"))
              or (type(v) is str and len(v) <= CUSTOM_MAX_STR))
        if not ok:
            raise ValueError(f"a {kind} record's field {k}={v!r:.80} is not valid; accepted: None, a bool, a 64-bit "
                             f"int, a finite float or a string of at most {CUSTOM_MAX_STR} characters")
