"""``lockstep predict``: the throughput an experiment should reach, by every applicable model of the paper.

"Predicting Throughput of Distributed Stochastic Gradient Descent" (Li, Paolieri,
Golubchik, Lin, Yan) gives coarse-grained models — asynchronous PS as a closed queueing
network solved by MVA (Eq. 1–5) with the overlap correction (Eq. 6), synchronous PS
(Eq. 7–10), ring all-reduce (Eq. 11) — and a fine-grained one: Algorithm 2.1 over
per-layer traces. :func:`predict` evaluates each on the inputs of a validated config
(:func:`inputs_of`): the model bytes per layer, the compute times, the NIC rates, the
latency and the sharing discipline the config names. Nothing is emulated, so it answers
in well under a second where an emulation takes minutes; ``predict=true`` on a run writes
the same into ``summary.json`` beside the emulated figures.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from controller import closed_forms as cf
from controller.predict import finegrained as fg
from controller.predict.mva import WorkerClass, solve

__all__ = ["Inputs", "LayerCost", "inputs_of", "predict", "predict_main", "summary_entry", "render", "SUPPORTED",
           "sync_match"]

SUPPORTED = {"PSAsync": "ps_async", "PSSync": "ps_sync", "RingAllReduce": "ring_allreduce"}
"""Strategy classes the paper models (one PS shard; SSP, gossip, federated ones are not modelled)."""


@dataclass(frozen=True)
class LayerCost:
    """One layer of the per-layer trace: parameter bytes and its share of a gradient call's duration."""

    name: str
    nbytes: int
    forward: float  # fraction of the gradient call
    backward: float


@dataclass(frozen=True)
class Inputs:
    """What the models use, in bytes and seconds (shown with every prediction)."""

    strategy: str  # ps_async | ps_sync | ring_allreduce | another name (no model applies)
    workers: int
    batch: tuple[int, ...]  # per worker
    model_bytes: int
    layers: tuple[LayerCost, ...]
    layer_source: str  # profile | estimator | flops | params
    gradient_s: tuple[float, ...]  # T_F + T_B per worker (speed, stragglers and jitter in the mean)
    update_s: float  # T_S
    aggregate_s: float  # one aggregation (sync PS: of K gradients; ring: of one chunk)
    compute_source: str
    bandwidth_ps_out: float  # bytes/s, efficiency applied (ring: the workers' rate)
    bandwidth_ps_in: float
    bandwidth_worker_out: tuple[float, ...]
    bandwidth_worker_in: tuple[float, ...]
    latency_s: float  # mean one-way latency
    egress: str
    ingress: str
    layerwise: bool
    forward_fraction: float
    allreduce_share: float
    rho_threshold: float = 0.5
    flow_cap: float | None = None
    steps: int = 20
    max_events: int = 20_000
    notes: tuple[str, ...] = ()  # what the inputs leave out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layers"] = [asdict(l) for l in self.layers]
        for k in ("batch", "gradient_s", "bandwidth_worker_out", "bandwidth_worker_in"):
            v = list(d[k])
            d[k] = v[0] if len(set(v)) == 1 else v  # one value when every worker has it
        return d


# ------------------------------------------------------------------ the models
def _link(disc: str) -> str:
    return {"fifo": "fcfs", "fair": "ps"}.get(disc, "unlimited")


def _mva_link(disc: str) -> str:
    """A station's discipline in :func:`mva.solve`: an unlimited NIC is a delay (no contention)."""
    link = _link(disc)
    return "delay" if link == "unlimited" else link


def _classes(inp: Inputs, compute: list[float]) -> list[WorkerClass]:
    """Workers grouped by identical demands (MVA classes): compute (+2 latencies), uplink, update, downlink."""
    groups: dict[tuple[float, float, float, float], int] = {}
    M = inp.model_bytes
    for k in range(inp.workers):
        key = (compute[k] + 2 * inp.latency_s, M / min(inp.bandwidth_worker_out[k], inp.bandwidth_ps_in),
               inp.update_s, M / min(inp.bandwidth_ps_out, inp.bandwidth_worker_in[k]))
        groups[key] = groups.get(key, 0) + 1
    return [WorkerClass(n, *key) for key, n in groups.items()]


def _batch_of_classes(inp: Inputs, classes: list[WorkerClass], compute: list[float]) -> list[float]:
    """Mean batch of each class (workers of one class may hold different batch sizes)."""
    out = []
    M = inp.model_bytes
    for c in classes:
        members = [inp.batch[k] for k in range(inp.workers)
                   if compute[k] + 2 * inp.latency_s == c.compute_s
                   and M / min(inp.bandwidth_worker_out[k], inp.bandwidth_ps_in) == c.uplink_s
                   and M / min(inp.bandwidth_ps_out, inp.bandwidth_worker_in[k]) == c.downlink_s]
        out.append(sum(members) / len(members))
    return out


def _entry(name: str, equation: str, updates_per_s: float, samples_per_s: float, step_s: float,
           **extra: Any) -> dict[str, Any]:
    return {"model": name, "equation": equation, "updates_per_s": updates_per_s,
            "samples_per_s": samples_per_s, "step_s": step_s, **extra}


def _mva(inp: Inputs, compute: list[float], name: str, equation: str, up: str, down: str | None = None,
         **extra: Any) -> tuple[dict[str, Any], Any, list[WorkerClass]]:
    """The MVA network of ``compute`` solved with ``up`` (and ``down``, default ``up``) links: (its entry, the
    solution, its classes)."""
    classes = _classes(inp, compute)
    r = solve(classes, up, downlink=down)
    batch = _batch_of_classes(inp, classes, compute)
    x = r.job_throughput
    return (_entry(name, equation, x, sum(xc * b for xc, b in zip(r.throughput, batch)),
                   inp.workers / x if x else math.inf, utilisation=r.utilisation, method=r.method, **extra),
            r, classes)


def _async_ps(inp: Inputs) -> list[dict[str, Any]]:
    """Eq. 1–6: MVA with FCFS and with PS links, the hybrid by the utilisation threshold, the overlap correction."""
    compute = list(inp.gradient_s)
    out = []
    results = {}
    for link in ("fcfs", "ps"):
        entry, r, classes = _mva(inp, compute, f"async_ps_mva_{link}", "Eq. 2-3" if link == "fcfs" else "Eq. 1, 4",
                                 link)
        results[link] = (r, classes)
        out.append(entry)
    up, down = _mva_link(inp.ingress), _mva_link(inp.egress)
    if "delay" in (up, down):  # an unlimited NIC at the PS: the model of this network, beside the paper's two
        out.append(_mva(inp, compute, _async_unlimited(inp), "Eq. 2-3, unlimited links as delays", up, down,
                        note=f"uplink {up}, downlink {down} (network.ingress / network.egress of the PS)")[0])
    rho = results["fcfs"][0].utilisation
    pick = out[0] if rho <= inp.rho_threshold else out[1]
    out.append({**pick, "model": "async_ps_hybrid", "equation": "Eq. 5",
                "note": f"rho_FCFS={rho:.3f} {'<=' if rho <= inp.rho_threshold else '>'} rho_T={inp.rho_threshold}"})
    # Eq. 6: the downlink overlaps the forward pass, the uplink the backward pass; solve again
    ff = inp.forward_fraction
    for link in ("fcfs", "ps"):
        r, classes = results[link]
        t_d = {c.downlink_s: t for c, t in zip(classes, r.downlink_s)}
        t_u = {c.uplink_s: t for c, t in zip(classes, r.uplink_s)}
        M = inp.model_bytes
        corrected = []
        for k in range(inp.workers):
            s_d = M / min(inp.bandwidth_ps_out, inp.bandwidth_worker_in[k])
            s_u = M / min(inp.bandwidth_worker_out[k], inp.bandwidth_ps_in)
            s_f, s_b = ff * compute[k], (1 - ff) * compute[k]
            corrected.append(max(0.0, s_f - t_d[s_d]) + max(0.0, s_b - t_u[s_u]))
        out.append(_mva(inp, corrected, f"async_ps_overlap_{link}", "Eq. 6", link)[0])
    return out


def _async_unlimited(inp: Inputs) -> str:
    up, down = _mva_link(inp.ingress), _mva_link(inp.egress)
    return "async_ps_mva_delay" if up == down else f"async_ps_mva_{up}_{down}"


def _sync_ps(inp: Inputs) -> list[dict[str, Any]]:
    """Eq. 7–10 for one round, with the slowest worker's compute (a round waits for it) and 2 latencies; with
    unlimited NICs at the PS, the round without contention too."""
    K, M, B = inp.workers, inp.model_bytes, min(inp.bandwidth_ps_out, inp.bandwidth_ps_in)
    t_c = max(inp.gradient_s)
    t_s = inp.update_s + inp.aggregate_s
    ff = inp.forward_fraction
    samples = sum(inp.batch)
    forms = [("sync_ps_eq7_ps", "Eq. 7", cf.ps_step(K, M, B, t_c, t_s, inp.latency_s)),
             ("sync_ps_eq8_fcfs", "Eq. 8", cf.fcfs_step(K, M, B, t_c, t_s, inp.latency_s)),
             ("sync_ps_eq9_hybrid", "Eq. 9", cf.hybrid_step(K, M, B, t_c, t_s, inp.latency_s)),
             ("sync_ps_eq10_overlap", "Eq. 10", cf.hybrid_overlap_step(K, M, B, ff * t_c, (1 - ff) * t_c, t_s,
                                                                        inp.latency_s))]
    if inp.egress == "unlimited" and inp.ingress == "unlimited":
        # every model and gradient crosses at its own rate: the slowest worker's way down, compute and way up
        step = max(M / min(inp.bandwidth_ps_out, inp.bandwidth_worker_in[k]) + inp.gradient_s[k]
                   + M / min(inp.bandwidth_worker_out[k], inp.bandwidth_ps_in) for k in range(K))
        forms.append(("sync_ps_uncontended", "Eq. 7-8 without sharing", step + t_s + 2 * inp.latency_s))
    return [_entry(n, eq, 1 / s, samples / s, s) for n, eq, s in forms]


def sync_match(egress: str, ingress: str) -> str:
    """The closed form of a synchronous round on the PS's NICs. A fifo egress sends the models one after
    another, so the gradients come back spaced by a model's time and never share the ingress: Eq. 8. Otherwise
    the models leave together (fair: all in K·M/B; unlimited: each in M/B) and the gradients come back together,
    K·M/B through a fifo or fair ingress, M/B each through an unlimited one."""
    if egress == "fifo":
        return "sync_ps_eq8_fcfs"
    if ingress == "unlimited":
        return "sync_ps_eq8_fcfs" if egress == "fair" else "sync_ps_uncontended"
    return "sync_ps_eq7_ps" if egress == "fair" else "sync_ps_eq8_fcfs"


def _ring(inp: Inputs) -> list[dict[str, Any]]:
    """Eq. 11, plus 2(K−1) latencies and the K−1 chunk additions of the reduce-scatter."""
    K, M = inp.workers, inp.model_bytes
    B = min(min(inp.bandwidth_worker_out), min(inp.bandwidth_worker_in))
    s = cf.ring_step(K, M, B, max(inp.gradient_s), inp.update_s, inp.latency_s) + (K - 1) * inp.aggregate_s
    return [_entry("ring_eq11", "Eq. 11", 1 / s, sum(inp.batch) / s, s)]


def _fine(inp: Inputs) -> list[dict[str, Any]]:
    """Algorithm 2.1 with the sharing models that apply, under the event budget."""
    ring = inp.strategy == "ring_allreduce"
    mode = "async" if inp.strategy == "ps_async" else "sync"
    links = ["all_reduce"] if ring else ["fcfs", "ps"]
    out = []
    for link in links:
        trace, workers = _trace(inp, link, mode)
        ops = len(trace.layer_bytes) * (3 if ring else 6) + 1  # (PS: each link operation adds a release)
        steps = inp.steps
        events = len(workers) * ops * steps
        if events > inp.max_events:
            steps = inp.max_events // (len(workers) * ops)
            if steps < 2:
                out.append({"model": f"finegrained_{link}", "equation": "Algorithm 2.1", "skipped":
                            f"{len(workers)} simulated workers x {ops} operations per step exceed predictor.max_events="
                            f"{inp.max_events}"})
                continue
        r = fg.simulate(trace, workers, steps)
        ups = r.updates_per_s
        per = inp.workers if mode == "async" else 1
        out.append(_entry(f"finegrained_{link}", "Algorithm 2.1", ups, r.samples_per_s,
                          per / ups if ups else math.inf, steps=steps, events=r.events,
                          simulated_workers=len(workers)))
    if not ring and len(out) == 2 and all("skipped" not in e for e in out) and mode == "sync":
        a, b = out
        step = (a["step_s"] + b["step_s"]) / 2  # §3.2.1: the mean of the PS and FCFS simulations
        out.append(_entry("finegrained_hybrid", "Algorithm 2.1 (§3.2.1 mean)", 1 / step, sum(inp.batch) / step, step))
    return out


def _trace(inp: Inputs, link: str, mode: str) -> tuple[fg.Trace, list[fg.SimWorker]]:
    ring = inp.strategy == "ring_allreduce"
    layers = inp.layers if inp.layerwise else (LayerCost("model", inp.model_bytes, inp.forward_fraction,
                                                         1 - inp.forward_fraction),)
    ns = 1e9
    per_worker = []
    for k in range(inp.workers):
        g = round(inp.gradient_s[k] * ns)  # whole ns per pass, as the emulation lays them out
        per_worker.append((tuple(float(round(l.forward * g)) for l in layers),
                           tuple(float(round(l.backward * g)) for l in layers), inp.batch[k]))
    # synchronous steps under PS or all-reduce sharing keep identical workers in lockstep: one stands for all
    collapse = mode == "sync" and link in ("ps", "all_reduce")
    workers: list[fg.SimWorker] = []
    if collapse:
        groups: dict[tuple, int] = {}
        for w in per_worker:
            groups[w] = groups.get(w, 0) + 1
        workers = [fg.SimWorker(f, b, batch, n) for (f, b, batch), n in groups.items()]
    else:
        workers = [fg.SimWorker(f, b, batch) for f, b, batch in per_worker]
    bw_ring = min(min(inp.bandwidth_worker_out), min(inp.bandwidth_worker_in))
    trace = fg.Trace(arch="ring" if ring else "ps", mode=mode, link=link,
                     layer_bytes=tuple(l.nbytes for l in layers),
                     bandwidth_down=bw_ring if ring else min(inp.bandwidth_ps_out, min(inp.bandwidth_worker_in)),
                     bandwidth_up=bw_ring if ring else min(inp.bandwidth_ps_in, min(inp.bandwidth_worker_out)),
                     latency_ns=inp.latency_s * ns, update_ns=inp.update_s * ns, aggregate_ns=inp.aggregate_s * ns,
                     workers_total=inp.workers, flow_cap=inp.flow_cap, allreduce_share=inp.allreduce_share)
    return trace, workers


MATCHES = {("ps_async", "fcfs"): "async_ps_mva_fcfs", ("ps_async", "ps"): "async_ps_mva_ps"}
"""The asynchronous PS's prediction for the network the config names at the PS's ingress (fifo = FCFS, fair =
processor sharing); an unlimited NIC picks the MVA with delay links, a synchronous round :func:`sync_match`."""


def predict(inp: Inputs, fine: bool = True) -> dict[str, Any]:
    """Every applicable model's prediction for ``inp``, the one matching the config's network, and timings."""
    t0 = time.perf_counter()
    if inp.strategy == "ps_async":
        models = _async_ps(inp)
    elif inp.strategy == "ps_sync":
        models = _sync_ps(inp)
    elif inp.strategy == "ring_allreduce":
        models = _ring(inp)
    else:
        return {"inputs": inp.to_dict(), "models": [], "selected": None,
                "note": f"no model of the throughput-prediction paper applies to strategy {inp.strategy!r} "
                        f"(accepted: {', '.join(SUPPORTED.values())} with one PS shard)"}
    t_coarse = time.perf_counter() - t0
    if fine:
        models += _fine(inp)
    link = _link(inp.ingress if inp.strategy == "ps_async" else inp.egress)
    if inp.strategy == "ring_allreduce":
        selected = "ring_eq11"
    elif inp.strategy == "ps_sync":
        selected = sync_match(inp.egress, inp.ingress)
    elif "unlimited" in (inp.egress, inp.ingress):
        selected = _async_unlimited(inp)
    else:
        selected = MATCHES.get((inp.strategy, link))
    if inp.layerwise:  # the emulation overlaps layers: Algorithm 2.1 on the same link model is the closest
        fine_name = "finegrained_all_reduce" if inp.strategy == "ring_allreduce" else f"finegrained_{link}"
        if any(m["model"] == fine_name and "skipped" not in m for m in models):
            selected = fine_name
    return {"inputs": inp.to_dict(), "models": models, "selected": selected,
            "coarse_s": t_coarse, "elapsed_s": time.perf_counter() - t0}


# -------------------------------------------------------------- from a config
def inputs_of(rc: Any) -> Inputs:
    """The models' inputs for a validated config (controller.config.RunConfig)."""
    from controller.plan import make_plan
    from controller.predict.costs import compute_times, layer_costs

    from agents.strategies import load_strategy

    cls = load_strategy(rc.strategy)
    name = SUPPORTED.get(cls.__name__, rc.strategy_name)
    if name in ("ps_async", "ps_sync") and (rc.strategy_settings.get("shards") or 1) > 1:
        name = f"{name} (shards={rc.strategy_settings['shards']})"
    plan = make_plan(rc, run_id="predict")
    ids = {v.name: i for i, v in enumerate(plan.vworkers)}
    workers = [i for i, v in enumerate(plan.vworkers) if v.holds_data]
    ps = ids.get("ps0", workers[0])
    net = plan.network
    times = compute_times(rc, plan)
    layers, source = layer_costs(rc, plan)
    lat = _mean_latency(net.latency, workers, ps)
    notes = []
    scale = 1.0  # goodput / the configured rate
    if net.tcp is not None:  # the closed forms on the tcp model's steady state: goodput and host latency
        tcp = net.tcp
        scale = tcp.mss / (tcp.mss + tcp.header_bytes + tcp.frame_bytes)
        lat += tcp.host_latency_ns / 1e9
        notes.append(f"network.model=tcp: links at the goodput ({scale:.2%} of the line rate) and latency plus "
                     "host latency; slow start, windows and ACKs are not modelled (exact only on network=ideal)")
    if rc.strategy_settings.get("collective") == "gloo":
        notes.append("strategy.collective=gloo: the closed forms are the ideal collectives; gloo's segments, "
                     "notifications and preambles are not modelled")
    if net.topology is not None:
        notes.append(f"network.topology={net.topology.name}: the paper's models see the NICs only, not the "
                     "topology's links")
    if rc.data.placement != "local":
        notes.append("data.placement=end_devices: the time spent waiting for data is not modelled")
    if rc.faults:
        kinds = sorted({f.kind for f in rc.faults})
        notes.append(f"faults ({', '.join(kinds)}): not modelled; the prediction is of the run without them")
    return Inputs(strategy=name, workers=len(workers), batch=tuple(plan.workload.batch_size),
                  model_bytes=sum(l.nbytes for l in layers), layers=tuple(layers), layer_source=source,
                  gradient_s=times.gradient, update_s=times.update, aggregate_s=times.aggregate,
                  compute_source=times.source,
                  bandwidth_ps_out=net.bandwidth_out[ps] * scale, bandwidth_ps_in=net.bandwidth_in[ps] * scale,
                  bandwidth_worker_out=tuple(net.bandwidth_out[i] * scale for i in workers),
                  bandwidth_worker_in=tuple(net.bandwidth_in[i] * scale for i in workers),
                  latency_s=lat, egress=net.egress, ingress=net.ingress, layerwise=rc.compute.layerwise,
                  forward_fraction=rc.compute.forward_fraction, allreduce_share=rc.compute.allreduce_share,
                  rho_threshold=rc.predictor.rho_threshold, flow_cap=rc.flow_cap, steps=rc.predictor.steps,
                  max_events=rc.predictor.max_events, notes=tuple(notes))


def _mean_latency(model: Any, workers: list[int], ps: int) -> float:
    """The mean one-way latency between the workers and the PS (or their ring neighbours), in seconds."""
    from agents.sim.network import ConstantLatency, DistributionLatency, MatrixLatency

    if isinstance(model, ConstantLatency):
        return model.ns / 1e9
    if isinstance(model, MatrixLatency):
        vals = [model.sample(w, ps, 0) for w in workers]
        return sum(vals) / len(vals) / 1e9
    if isinstance(model, DistributionLatency):  # the mean of the keyed draws (the same draws a run makes)
        vals = [model.sample(w, ps, seq) for w in workers[:64] for seq in range(1, 17)]
        return sum(vals) / len(vals) / 1e9
    return 0.0


def summary_entry(rc: Any, summary: dict[str, Any]) -> dict[str, Any]:
    """``summary.json["predictions"]`` of a run with ``predict=true``: every model, and its error against the run.

    The emulated throughput is the run's own (samples over virtual seconds, warm-up included),
    so a short run's first step weighs in it; ``error`` is (predicted − emulated) / emulated.
    """
    try:
        result = predict(inputs_of(rc))
    except PredictInputError as e:
        return {"error": str(e)}
    emulated = summary.get("throughput_samples_per_s") or 0.0
    for m in result["models"]:
        if "samples_per_s" in m and emulated > 0:
            m["error"] = (m["samples_per_s"] - emulated) / emulated
    return json.loads(json.dumps(result))  # plain JSON data: the run's summary equals the summary.json it writes


# ---------------------------------------------------------------------- the CLI
USAGE = """usage: lockstep predict [--json] [--no-finegrained] [overrides...]

The throughput the experiment the overrides describe should reach (the same overrides as
`lockstep run`), by every applicable model of the throughput-prediction paper: asynchronous PS
by MVA (Eq. 1-6), synchronous PS (Eq. 7-10), ring all-reduce (Eq. 11), Algorithm 2.1 over
per-layer traces; with the inputs they used. Nothing is emulated.
"""


def predict_main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="lockstep predict", usage=USAGE.removeprefix("usage: "))
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-finegrained", action="store_true", help="the coarse-grained models only")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args(argv)
    from controller.config import ConfigError, load

    try:
        rc = load(a.overrides, check_data=False)
    except ConfigError as e:
        print("lockstep predict: invalid configuration:", file=sys.stderr)
        for problem in e.problems:
            print(f"  {problem}", file=sys.stderr)
        return 2
    try:
        inp = inputs_of(rc)
    except PredictInputError as e:
        print(f"lockstep predict: {e}", file=sys.stderr)
        return 2
    result = predict(inp, fine=not a.no_finegrained)
    if not result["models"]:  # a strategy none of the paper's models describes: nothing to print
        print(f"lockstep predict: {result['note']}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(result, indent=1, sort_keys=True, default=str))
        return 0
    print(render(result))
    return 0


def render(result: dict[str, Any]) -> str:
    """A human-readable table of a prediction."""
    inp = result["inputs"]
    nic = "NIC" if inp["strategy"] == "ring_allreduce" else "PS NIC"  # a ring has no PS: each worker's NIC
    lines = [f"{inp['strategy']}, K={inp['workers']}, batch {inp['batch']}, model {inp['model_bytes']} B in "
             f"{len(inp['layers'])} layers ({inp['layer_source']}), gradient {_fmt(inp['gradient_s'])} s, update "
             f"{inp['update_s']:.6g} s ({inp['compute_source']}), {nic} "
             f"{inp['bandwidth_ps_out']:.6g} B/s, "
             f"latency {inp['latency_s']:.6g} s, {inp['egress']}/{inp['ingress']}"
             + (", layer-wise" if inp["layerwise"] else "")]
    if result.get("note"):
        lines.append(result["note"])
    lines += [f"note: {n}" for n in inp.get("notes", [])]
    lines.append(f"{'model':28} {'equation':26} {'samples/s':>12} {'updates/s':>12} {'step [s]':>12}")
    for m in result["models"]:
        mark = "*" if m["model"] == result["selected"] else " "
        if "skipped" in m:
            lines.append(f"{mark}{m['model']:27} {m['equation']:26} skipped: {m['skipped']}")
            continue
        extra = f"  {m['note']}" if "note" in m else (f"  {m['method']}" if "method" in m else "")
        lines.append(f"{mark}{m['model']:27} {m['equation']:26} {m['samples_per_s']:12.6g} {m['updates_per_s']:12.6g} "
                     f"{m['step_s']:12.6g}{extra}")
    if result["selected"]:
        lines.append(f"* the model of the network this config names; computed in {result['elapsed_s'] * 1e3:.1f} ms")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, (int, float)) else "[" + ", ".join(f"{x:.4g}" for x in v) + "]"


class PredictInputError(ValueError):
    """The config's compute times cannot be known without running (one sentence)."""
