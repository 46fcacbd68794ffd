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

__all__ = ["DeviceProfile", "ProfileError", "profiles_dir", "read_profile", "profile_main"]

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


def read_profile(name_or_path: str) -> DeviceProfile:
    """The profile named ``name_or_path`` (conf/profiles/<name>.json) or stored at that path."""
    path = _path_of(name_or_path)
    shipped = sorted(p.stem for p in profiles_dir().glob("*.json"))
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"compute.profile={name_or_path!r} is not valid: no file {path}; accepted: "
                           f"{' | '.join(shipped) or '(none shipped)'}, a path to a profile made by "
                           "`lockstep profile`, or null.") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileError(f"compute.profile={name_or_path!r}: {path} is not a readable JSON profile ({e}).") from None
    sigs = d.get("signatures") if isinstance(d, dict) else None
    if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not isinstance(sigs, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for k, v in sigs.items()):
        raise ProfileError(f"compute.profile={name_or_path!r}: {path} is not a device profile; accepted: "
                           '{"name": ..., "signatures": {signature: seconds >= 0}} as `lockstep profile` writes.')
    est = d.get("estimators", {})
    if not isinstance(est, dict) or not all(isinstance(v, dict) for v in est.values()):
        raise ProfileError(f"compute.profile={name_or_path!r}: {path} has an 'estimators' section that is not a "
                           "mapping of fitted models as `lockstep profile --estimator` writes.")
    return DeviceProfile(d["name"], {k: float(v) for k, v in sigs.items()}, str(d.get("host", "")),
                         str(d.get("torch", "")), int(d.get("threads", 1) or 1), str(d.get("created", "")), est,
                         d.get("layers", {}) if isinstance(d.get("layers"), dict) else {})


USAGE = """usage: lockstep profile --name NAME [--out FILE] [--layers] [--estimator N] [overrides...]

Measure the compute calls of the experiment the overrides describe on this machine (median of
compute.runs timed runs each, after a warm-up) and write a device profile: conf/profiles/NAME.json,
or FILE. The gradient, the update and a K-way aggregate are timed first; the experiment then runs for
three updates in this process so that every other call its strategy makes is timed too. Then
`lockstep run compute.profile=NAME ...` emulates this machine on any host. Profiling into an existing
profile adds to it (other signatures are kept) when it has this NAME and was measured on this host;
one of another name or host is refused (exit 2): give another --out or --name. NAME does not end in .json.
--layers adds each layer's forward and backward time (Tianshu's N/M-copies differencing), which
compute.layerwise uses; --estimator N times N random shapes per operation kind (median of three
passes), fits a cost model per backend for shapes no one profiled and reports its held-out error
beside Tianshu's principal-component estimator's (docs/predict.md).
"""


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
    from controller.config import ConfigError, load

    try:
        rc = load([*a.overrides, "compute=profiled", "compute.profile=null"])
    except ConfigError as e:
        print("lockstep profile: invalid configuration:", file=sys.stderr)
        for problem in e.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    out = Path(a.out) if a.out else profiles_dir() / f"{a.name}.json"
    old = _existing(out)
    if old is not None:  # before timing, not after
        why = _cannot_add(out, old, a.name, this_host(rc.device, rc.threads))
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
    old = _existing(out)
    if old is not None:
        why = _cannot_add(out, old, a.name, prof.host)  # as checked above, unless the file changed meanwhile
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
    """The device profile already at ``out``, or None (no file, or not a profile: it is overwritten)."""
    if not out.exists():
        return None
    try:
        return read_profile(str(out.absolute()))  # a path, even where --out looks like a NAME
    except ProfileError:
        return None


def _cannot_add(out: Path, old: DeviceProfile, name: str, host: str) -> str | None:
    """Why the timings of ``host`` for the profile ``name`` cannot be added to ``old``, stored at ``out``,
    as one sentence; None if they can (same name, same host)."""
    if old.host != host:
        where = repr(old.host) if old.host else "an unknown host"
        return (f"{out} holds the profile {old.name!r} measured on {where}, not on this "
                f"host ({host!r}), and one profile cannot mix two machines' timings; accepted: another --out "
                "(or another --name without --out) for a profile of this host.")
    if old.name != name:
        return (f"{out} holds the profile {old.name!r}, not {name!r}; accepted: --name {old.name} to add to it, "
                f"or another --out (or no --out) for a profile named {name!r}.")
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
