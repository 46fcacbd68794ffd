"""Device profiles: what "the emulated machine" is, as a file that travels with the config.

A profile is a JSON file ``{"name", "host", "torch", "threads", "created", "signatures": {signature: seconds}}``:
the median durations of the compute calls of an experiment, measured once on one machine by
``lockstep profile`` (Tianshu's ahead-of-time database, made portable). ``compute.profile=<name>``
reads ``conf/profiles/<name>.json`` (or a path) and puts its durations into the plan, so every agent,
on every host, gives a call the same virtual duration: the run is the same on a laptop and a cluster.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DeviceProfile", "ProfileError", "ignored_overrides", "profiles_dir", "read_profile", "profile_main"]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MIN_ESTIMATOR_SHAPES = 10  # fewer leave the fit 1-8 training shapes: a traceback, or held-out errors of 32-370 %


def is_name(s: str) -> bool:
    """Whether ``s`` is a profile's name (conf/profiles/<s>.json) rather than a path: 1-63 letters, digits,
    '.', '_', '-', not ending in '.json' (``compute.profile=foo.json`` is the file ./foo.json, so a profile
    named ``foo.json`` could not be found again); ``lockstep profile --name`` accepts only these."""
    return bool(NAME.match(s)) and not s.endswith(".json")


class ProfileError(ValueError):
    """A device profile that cannot be used (missing, malformed); the message is one sentence."""


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    signatures: dict[str, float]
    host: str = ""
    torch: str = ""
    threads: int = 1
    created: str = ""
    estimators: dict[str, Any] = field(default_factory=dict)  # "<kind>/<pass>" -> agents.sim.estimator.OpModel
    layers: dict[str, Any] = field(default_factory=dict)  # "<model>/batch<b>" -> its layers: bytes, times

    def to_json(self) -> str:
        d = {"name": self.name, "host": self.host, "torch": self.torch, "threads": self.threads,
             "created": self.created, "signatures": dict(sorted(self.signatures.items()))}
        if self.estimators:
            d["estimators"] = dict(sorted(self.estimators.items()))
        if self.layers:
            d["layers"] = dict(sorted(self.layers.items()))
        return json.dumps(d, indent=1) + "\n"


def profiles_dir() -> Path:
    from controller.config.load import CONF_DIR

    return Path(CONF_DIR) / "profiles"


def _path_of(name_or_path: str) -> Path:
    if is_name(name_or_path):
        return profiles_dir() / f"{name_or_path}.json"
    return Path(name_or_path).expanduser()


class _NotAProfile(Exception):
    """Why a file is not a device profile: ``kind`` (unreadable, shape, estimators) and a short clause."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


_SHAPE = '{"name": ..., "signatures": {signature: seconds >= 0}}'


def _parse(path: Path) -> DeviceProfile:
    """The device profile stored at ``path``; FileNotFoundError when there is none, else :class:`_NotAProfile`."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise _NotAProfile("unreadable", f"it cannot be read: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise _NotAProfile("unreadable", f"not UTF-8 text: byte 0x{e.object[e.start]:02x} at offset {e.start}") from e
    except json.JSONDecodeError as e:
        raise _NotAProfile("unreadable", f"not JSON: {e.msg} at line {e.lineno} column {e.colno}") from e
    sigs = d.get("signatures") if isinstance(d, dict) else None
    if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not isinstance(sigs, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for k, v in sigs.items()):
        raise _NotAProfile("shape", f"not {_SHAPE} as `lockstep profile` writes it")
    est = d.get("estimators", {})
    if not isinstance(est, dict) or not all(isinstance(v, dict) for v in est.values()):
        raise _NotAProfile("estimators", "its 'estimators' section is not a mapping of fitted models")
    return DeviceProfile(d["name"], {k: float(v) for k, v in sigs.items()}, str(d.get("host", "")),
                         str(d.get("torch", "")), int(d.get("threads", 1) or 1), str(d.get("created", "")), est,
                         d.get("layers", {}) if isinstance(d.get("layers"), dict) else {})


def read_profile(name_or_path: str) -> DeviceProfile:
    """The profile named ``name_or_path`` (conf/profiles/<name>.json) or stored at that path."""
    path = _path_of(name_or_path)
    try:
        return _parse(path)
    except FileNotFoundError:
        shipped = sorted(p.stem for p in profiles_dir().glob("*.json"))
        raise ProfileError(f"compute.profile={name_or_path!r} is not valid: no file {path}; accepted: "
                           f"{' | '.join(shipped) or '(none shipped)'}, a path to a profile made by "
                           "`lockstep profile`, or null.") from None
    except _NotAProfile as e:
        if e.kind == "unreadable":  # the cause's own words (an OSError, a JSON or UTF-8 decoding error)
            raise ProfileError(f"compute.profile={name_or_path!r}: {path} is not a readable JSON profile "
                               f"({e.__cause__}).") from None
        if e.kind == "shape":
            raise ProfileError(f"compute.profile={name_or_path!r}: {path} is not a device profile; accepted: "
                               f"{_SHAPE} as `lockstep profile` writes.") from None
        raise ProfileError(f"compute.profile={name_or_path!r}: {path} has an 'estimators' section that is not a "
                           "mapping of fitted models as `lockstep profile --estimator` writes.") from None


USAGE = """usage: lockstep profile --name NAME [--out FILE] [--layers] [--estimator N] [overrides...]

Measure the compute calls of the experiment the overrides describe on this machine (median of
compute.runs timed runs each, after a warm-up) and write a device profile: conf/profiles/NAME.json,
or FILE. The gradient, the update and a K-way aggregate are timed first; the experiment then runs for
three updates in this process so that every other call its strategy makes is timed too. Then
`lockstep run compute.profile=NAME ...` emulates this machine on any host. Profiling into an existing
profile adds to it (other signatures are kept) when it has this NAME and was measured on this host
with this torch; one of another name, host or torch version, or a file at --out that is no profile, is
refused (exit 2), the file untouched: give another --out or --name. NAME does not end in .json.
compute= and the compute.* keys the measurement does not read (a constant's durations, another
profile, compute.db, ...) are refused too: it times this host's real calls, compute.runs times each.
--layers adds each layer's forward and backward time (Tianshu's N/M-copies differencing), which
compute.layerwise uses; --estimator N times N random shapes per operation kind (median of three
passes), fits a cost model per backend for shapes no one profiled and reports its held-out error
beside Tianshu's principal-component estimator's (docs/predict.md).
"""


_REAL = ("this host's real computations of the model, batch sizes and device the other overrides describe; "
         "accepted: leave it out")
# compute.<key> that a profile's measurement does not read (it times under compute=profiled, into a database of
# its own): why, as the end of a sentence; compute.runs and the keys of the short run that finds the strategy's
# calls (speed, stragglers, jitter, batch, layerwise, ...) are read, and so accepted
_IGNORED = {
    **dict.fromkeys(("gradient", "update", "aggregate"),
                    f"it is a duration of compute=constant and compute=distribution, and a profile times {_REAL}"),
    **dict.fromkeys(("distribution", "params", "kinds"),
                    f"it shapes compute=distribution's draws, and a profile times {_REAL}"),
    "peak_flops": f"it is compute=analytic's FLOP rate, and a profile times {_REAL}",
    "profile": "a profile is measured on this host, not copied from another one; accepted: leave it out (--name and "
               "--out say which profile is written)",
    "db": "a profile times every call afresh, into a database of its own that it does not keep; accepted: leave it "
          "out",
}
_COMPUTE_OVERRIDE = re.compile(r"^(?:\+\+|\+)?compute(?:\.(\w+))?=(.*)$")


def ignored_overrides(overrides: list[str]) -> list[str]:
    """The overrides among ``overrides`` that a profile's measurement would drop (compute=constant, a constant's
    duration, another profile, ...), each as one sentence naming it, its value and why; [] if none. An override
    that agrees with the measurement (compute=profiled, compute.profile=null) is no problem."""
    problems = []
    for o in overrides:
        m = _COMPUTE_OVERRIDE.match(o)
        if m is None:
            continue
        key, value = m.groups()
        shown = f"compute={value}" if key is None else f"compute.{key}={value}"
        if key is None:
            if value != "profiled":
                problems.append(f"{shown} has no effect on a profile, which times "
                                f"{_REAL.replace('real computations', 'real computations (compute=profiled)')}.")
        elif key in _IGNORED and not (key == "profile" and value == "null"):
            problems.append(f"{shown} has no effect on a profile: {_IGNORED[key]}.")
    return problems


def profile_main(argv: list[str]) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="lockstep profile", usage=USAGE.removeprefix("usage: "))
    p.add_argument("--name", required=True,
                   help="the profile's name (letters, digits, . _ -; not ending in .json)")
    p.add_argument("--out", help="where to write it (default: conf/profiles/NAME.json)")
    p.add_argument("--layers", action="store_true", help="also time every layer's forward and backward pass")
    p.add_argument("--estimator", type=int, default=0, metavar="N",
                   help=f"fit the per-operation estimator on N >= {MIN_ESTIMATOR_SHAPES} random shapes per kind "
                        "(0: no)")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    if not (a.estimator == 0 or a.estimator >= MIN_ESTIMATOR_SHAPES):
        print(f"lockstep profile: --estimator {a.estimator} is not valid; accepted: 0 (none) or at least "
              f"{MIN_ESTIMATOR_SHAPES} shapes.", file=sys.stderr)
        return 2
    if not is_name(a.name):
        print(f"lockstep profile: --name {a.name!r} is not valid; accepted: 1-63 letters, digits, '.', '_', '-', "
              "not ending in '.json' (the profile is written to NAME.json).", file=sys.stderr)
        return 2
    ignored = ignored_overrides(a.overrides)
    if ignored:
        for why in ignored:
            print(f"lockstep profile: {why}", file=sys.stderr)
        return 2
    from controller.config import ConfigError, load

    try:
        rc = load([*a.overrides, "compute=profiled", "compute.profile=null"])
    except ConfigError as e:
        print("lockstep profile: invalid configuration:", file=sys.stderr)
        for problem in e.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    out = Path(a.out) if a.out else profiles_dir() / f"{a.name}.json"
    import torch

    try:
        old = _existing(out)
    except ProfileError as e:
        print(f"lockstep profile: {e}", file=sys.stderr)
        return 2
    if old is not None:  # before timing, not after
        why = _cannot_add(out, old, a.name, this_host(rc.device, rc.threads), torch.__version__)
        if why:
            print(f"lockstep profile: {why}", file=sys.stderr)
            return 2
    from controller.outputs import unwritable

    why = unwritable(out)  # before timing, not after
    if why:
        print(f"lockstep profile: --out {out}: {why}; accepted: a file to write the profile to.", file=sys.stderr)
        return 2
    prof = measure(rc, a.name, a.overrides)
    if a.layers or a.estimator:
        from controller.estimate import fit_estimators, layer_signatures

        sigs = dict(prof.signatures)
        listing: dict[str, list] = {}
        if a.layers:
            sigs.update(layer_signatures(rc, repeats=max(3, rc.compute.profile_runs), listing=listing))
            for key, rows in listing.items():
                for r in rows:
                    print(f"{key} {r['name']:>10} {r['kind']:8} {r['param_bytes']:>9} B  forward "
                          f"{r['forward_s'] * 1e6:9.1f} us  backward {r['backward_s'] * 1e6:9.1f} us", file=sys.stderr)
        est = fit_estimators(a.estimator, rc.seed, repeats=3) if a.estimator else {}
        prof = DeviceProfile(prof.name, sigs, prof.host, prof.torch, prof.threads, prof.created, est, listing)
    try:
        old = _existing(out)  # as checked above, unless the file changed meanwhile
    except ProfileError as e:
        print(f"lockstep profile: {e}", file=sys.stderr)
        return 2
    if old is not None:
        why = _cannot_add(out, old, a.name, prof.host, prof.torch)
        if why:
            print(f"lockstep profile: {why}", file=sys.stderr)
            return 2
        prof = DeviceProfile(prof.name, {**old.signatures, **prof.signatures}, prof.host, prof.torch,
                             prof.threads, prof.created, {**old.estimators, **prof.estimators},
                             {**old.layers, **prof.layers})
    from agents.common.files import write_atomic

    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, prof.to_json())
    for sig, s in sorted(prof.signatures.items()):
        print(f"{s * 1e3:10.3f} ms  {sig}")
    print(f"lockstep profile: {len(prof.signatures)} signatures of {prof.host} written to {out}", file=sys.stderr)
    return 0


def _existing(out: Path) -> DeviceProfile | None:
    """The device profile already at ``out``, or None (no file; or a directory, which ``unwritable`` refuses).

    A file that is there but is no profile (unreadable, not JSON, not UTF-8, another shape) raises
    :class:`ProfileError`, one sentence: writing the new profile there would lose what the file holds."""
    if not out.exists() or out.is_dir():
        return None
    try:
        return _parse(out)
    except FileNotFoundError:
        return None
    except _NotAProfile as e:
        raise ProfileError(f"{out} is not a device profile to add to ({e.reason}), and writing there would lose "
                           f"what it holds; accepted: another --out (or another --name without --out), or move "
                           f"{out} away first.") from None


def _cannot_add(out: Path, old: DeviceProfile, name: str, host: str, torch_version: str) -> str | None:
    """Why the timings of ``host`` under torch ``torch_version`` for the profile ``name`` cannot be added to
    ``old``, stored at ``out``, as one sentence; None if they can (same host, same name, same torch)."""
    if old.host != host:
        where = repr(old.host) if old.host else "an unknown host"
        return (f"{out} holds the profile {old.name!r} measured on {where}, not on this "
                f"host ({host!r}), and one profile cannot mix two machines' timings; accepted: another --out "
                "(or another --name without --out) for a profile of this host.")
    if old.name != name:
        return (f"{out} holds the profile {old.name!r}, not {name!r}; accepted: --name {old.name} to add to it, "
                f"or another --out (or no --out) for a profile named {name!r}.")
    if old.torch != torch_version:  # another torch runs the same calls through other kernels: other timings
        theirs = f"torch {old.torch}" if old.torch else "an unknown torch version"
        return (f"{out} holds the profile {old.name!r} measured with {theirs}, not with this torch "
                f"({torch_version}), and one profile cannot mix two torch versions' timings; accepted: another "
                f"--out (or another --name without --out), or move {out} away to measure the profile again with "
                "this torch.")
    return None


def this_host(device: str, threads: int) -> str:
    """The device kind ``measure`` records for ``device`` with ``threads`` torch threads (it sets them too)."""
    import torch

    from agents.sim.compute import device_kind, resolve_device

    torch.set_num_threads(threads)
    return device_kind(resolve_device(device))


# what the short run that finds the strategy's own calls changes in the experiment (measure)
_FIND_CALLS = ["launcher=inprocess", "agents=1", "stop.updates=3", "stop.virtual_time=null", "eval.every=0",
               "trace.mode=off", "statelog.enabled=false", "progress=false", "recovery.checkpoint_every_s=0",
               "metrics.port=null", "faults=[]"]


def measure(rc: Any, name: str, overrides: list[str] | None = None) -> DeviceProfile:
    """Time the calls the run makes on this host, into a fresh database: the gradient, the update and a
    K-way aggregate ahead of time (Training.profile); then, given the experiment's ``overrides``, whatever
    else its strategy computes — a ring's additions, FedAvg's weighted aggregate, gossip's mean of three —
    found by running the experiment for three updates in this process, each call the database lacks timed
    the same way (agents.sim.compute.timing_misses)."""
    import tempfile

    import torch

    from agents.sim.compute import ComputeModel, timing_misses
    from agents.workloads.training import Training
    from controller.plan import make_plan

    plan = make_plan(rc, run_id="profile")
    torch.set_num_threads(plan.workload.threads)
    with tempfile.TemporaryDirectory() as tmp:
        spec = plan.compute
        from dataclasses import replace

        db = Path(tmp) / "db.json"
        compute = ComputeModel(replace(spec, profile_db=str(db)))
        training = Training(plan.workload, plan.seed)
        training.profile(compute, workers=len(plan.workload.data_holders))
        if overrides is not None:
            from controller.config import load
            from controller.run import execute

            short = load([*overrides, "compute=profiled", "compute.profile=null", f"compute.db={db}", *_FIND_CALLS])
            with timing_misses():
                execute(short, Path(tmp) / "run")
        host = this_host(spec.device, plan.workload.threads)
        sigs = json.loads(db.read_text())[host]
    return DeviceProfile(name, sigs, host, torch.__version__, plan.workload.threads,
                         time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
