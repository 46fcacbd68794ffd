"""Parse config values given as SI numbers or unit strings ("1ms", "10Gbit/s", "100MB/s", "4KiB")."""
from __future__ import annotations

import re

__all__ = ["parse_duration", "parse_rate", "parse_size", "UnitError"]


class UnitError(ValueError):
    """A value that is not a number or a string with an accepted unit."""


_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_DURATION = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "": 1.0}
_PREFIX = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _split(value: object, what: str, accepted: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise UnitError(f"{what}: {value!r} is not a number; accepted: {accepted}")
    if isinstance(value, (int, float)):
        return float(value), ""
    if not isinstance(value, str):
        raise UnitError(f"{what}: {value!r} is not a number; accepted: {accepted}")
    m = re.fullmatch(_NUM + r"\s*(\S*)", value.strip())
    if not m:
        raise UnitError(f"{what}: cannot read {value!r}; accepted: {accepted}")
    return float(m.group(1)), m.group(2)


def parse_duration(value: object, what: str = "duration") -> float:
    """Seconds from a number (seconds) or a string like ``"1ms"``, ``"250us"``, ``"2s"``."""
    num, unit = _split(value, what, "seconds as a number, or a string with ns, us, ms, s, min, h")
    if unit not in _DURATION:
        raise UnitError(f"{what}: unknown time unit {unit!r} in {value!r}; accepted: ns, us, ms, s, min, h")
    return num * _DURATION[unit]


def _bits_or_bytes(unit: str, value: object, what: str, accepted: str) -> float:
    m = re.fullmatch(r"(Ki|Mi|Gi|Ti|k|K|M|G|T|)(bit|b|B|bps|Bps)", unit)
    if not m:
        raise UnitError(f"{what}: unknown unit {unit!r} in {value!r}; accepted: {accepted}")
    scale = _PREFIX[m.group(1)]
    return scale / 8 if m.group(2) in ("bit", "b", "bps") else scale


def parse_rate(value: object, what: str = "bandwidth") -> float:
    """Bytes per second from a number (bytes/s) or ``"10Gbit/s"``, ``"100MB/s"``, ``"1Gbps"``."""
    accepted = "bytes/s as a number, or a string like 10Gbit/s, 1Gbps, 100MB/s, 50MiB/s"
    num, unit = _split(value, what, accepted)
    if unit == "":
        return num
    if unit.endswith("/s"):
        unit = unit[:-2]
    elif not unit.endswith("ps"):
        raise UnitError(f"{what}: {value!r} is not a rate (missing /s); accepted: {accepted}")
    return num * _bits_or_bytes(unit, value, what, accepted)


def parse_size(value: object, what: str = "size") -> float:
    """Bytes from a number or ``"4KiB"``, ``"100MB"``, ``"1Gbit"``."""
    accepted = "bytes as a number, or a string like 100MB, 4KiB, 1Gbit"
    num, unit = _split(value, what, accepted)
    if unit == "":
        return num
    return num * _bits_or_bytes(unit, value, what, accepted)
