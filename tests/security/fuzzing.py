"""Fuzzed protocol frames and wire values (hypothesis strategies) and the property each must meet.

Used by ``tests/security/test_fuzz.py`` (a few hundred examples in the suite) and
``benchmarks/bench_fuzz.py`` (tens of thousands, counted in docs/benchmarks.md). The property: whatever an
agent sends, the controller either accepts a well-formed ``Reached`` or fails that agent with an
``AgentFailure`` — never another exception, never more memory than the plan's limits allow; whatever a
controller sends, an agent's decoding raises nothing but ``WireError``.
"""
from __future__ import annotations

import queue
import tracemalloc
from typing import Any

from hypothesis import strategies as st

from agents.common import wire
from agents.common.plan import Plan
from controller.launchers.base import AgentFailure
from controller.remote import RemoteAgent
from protos.lockstep.v1 import agent_pb2 as pb

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
SMALL = st.integers(-3, 12)
ANY_INT = st.one_of(SMALL, INT64)
DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool", "complex64", "uint16",
          "", "float128", "object", "float32\x00"]
LIMITS = wire.Limits(max_blob_bytes=1 << 16, max_pending_bytes=1 << 18, max_pending_blobs=16)


@st.composite
def tensors(draw: Any, t: pb.Tensor) -> None:
    t.dtype = draw(st.sampled_from(DTYPES))
    t.numpy = draw(st.booleans())
    t.shape.extend(draw(st.lists(st.one_of(st.integers(0, 8), INT64), max_size=draw(st.sampled_from([3, 40])))))
    src = draw(st.sampled_from(["data", "blob", "peer", "none"]))
    if src == "data":
        t.data = draw(st.binary(max_size=96))
    elif src == "blob":
        t.blob = draw(ANY_INT)
    elif src == "peer":
        t.peer.agent, t.peer.id, t.peer.nbytes = draw(st.integers(-2, 4)), draw(ANY_INT), draw(ANY_INT)


@st.composite
def values(draw: Any, depth: int = 0) -> pb.Value:
    v = pb.Value()
    kinds = ["none", "b", "i", "f", "s", "raw", "tensor", "unset"] + (["tuple", "list", "dict"] if depth < 4 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        v.none = True
    elif kind == "b":
        v.b = draw(st.booleans())
    elif kind == "i":
        v.i = draw(ANY_INT)
    elif kind == "f":
        v.f = draw(st.floats())
    elif kind == "s":
        v.s = draw(st.text(max_size=12))
    elif kind == "raw":
        v.raw = draw(st.binary(max_size=24))
    elif kind == "tensor":
        draw(tensors(v.tensor))
    elif kind in ("tuple", "list"):
        seq = getattr(v, kind)
        seq.SetInParent()
        for item in draw(st.lists(values(depth + 1), max_size=3)):
            seq.items.add().CopyFrom(item)
    elif kind == "dict":
        v.dict.SetInParent()
        for k in draw(st.lists(values(depth + 1), max_size=3)):
            v.dict.keys.add().CopyFrom(k)
        for x in draw(st.lists(values(depth + 1), max_size=3)):
            v.dict.values.add().CopyFrom(x)
    return v


@st.composite
def rows(draw: Any) -> pb.Value:
    """A list of (key, ...) tuples close enough to real rows to get past the first checks."""
    v = pb.Value()
    v.list.SetInParent()
    for _ in range(draw(st.integers(0, 3))):
        item = v.list.items.add().tuple
        item.SetInParent()
        key = item.items.add().tuple
        key.SetInParent()
        for x in draw(st.lists(ANY_INT, min_size=2, max_size=4)):
            key.items.add().i = x
        for x in draw(st.lists(values(2), max_size=4)):
            item.items.add().CopyFrom(x)
    return v


@st.composite
def events(draw: Any, e: pb.Event) -> None:
    e.time, e.priority, e.origin, e.seq, e.dst = (draw(ANY_INT), draw(SMALL), draw(st.integers(-1, 4)),
                                                  draw(ANY_INT), draw(st.integers(-1, 4)))
    e.kind = draw(st.sampled_from(["arrive", "notify", "tail", "", "x" * 300]))
    if draw(st.booleans()):
        e.effect = draw(ANY_INT)
    which = draw(st.sampled_from(["transfer", "value", "none"]))
    if which == "transfer":
        t = e.transfer
        t.src, t.dst, t.seq, t.nbytes, t.sent_at, t.e0, t.latency = (draw(SMALL) for _ in range(7))
        t.src_name, t.dst_name = draw(st.text(max_size=6)), draw(st.text(max_size=6))
        t.tag.CopyFrom(draw(values(2)))
        t.payload.CopyFrom(draw(values(1)))
        t.cap = draw(st.floats())
    elif which == "value":
        e.value.CopyFrom(draw(values(1)))


@st.composite
def reached_frames(draw: Any) -> pb.AgentFrame:
    f = pb.AgentFrame()
    r = f.reached
    r.window = draw(st.sampled_from([1, 1, 1, 0, 2]))
    r.next_time, r.horizon = draw(ANY_INT), draw(ANY_INT)
    if draw(st.booleans()):
        r.stop_time = draw(ANY_INT)
    for _ in range(draw(st.integers(0, 3))):
        draw(events(r.outbound.add()))
    for field in (r.updates, r.evals, r.events):
        field.CopyFrom(draw(st.one_of(rows(), values())))
    r.stats.events = draw(ANY_INT)
    return f


@st.composite
def frame_streams(draw: Any) -> list[bytes]:
    """Serialized frames as a peer might send them: chunks, envelopes, a final frame; some bytes mangled."""
    out: list[pb.AgentFrame] = []
    for _ in range(draw(st.integers(0, 4))):
        f = pb.AgentFrame()
        kind = draw(st.sampled_from(["chunk", "chunk", "envelope", "reached", "other"]))
        if kind == "chunk":
            c = f.chunk
            c.blob, c.total, c.offset = draw(st.integers(-1, 4)), draw(st.one_of(SMALL, INT64, st.just(1 << 30))), \
                draw(st.one_of(st.integers(0, 40), INT64))
            c.data = draw(st.binary(max_size=64))
        elif kind == "envelope":
            f.envelope = draw(st.integers(-1, 4))
        elif kind == "reached":
            f = draw(reached_frames())
        else:
            f.failure.error = draw(st.text(max_size=10)) if draw(st.booleans()) else ""
            if not draw(st.booleans()):
                f = pb.AgentFrame()
        out.append(f)
    out.append(draw(reached_frames()))
    data = [f.SerializeToString() for f in out]
    if draw(st.booleans()):  # mangle one frame's bytes: truncate, flip, insert
        i = draw(st.integers(0, len(data) - 1))
        b = bytearray(data[i])
        how = draw(st.sampled_from(["truncate", "flip", "insert"]))
        pos = draw(st.integers(0, max(len(b), 1)))
        if how == "truncate":
            b = b[:pos]
        elif how == "flip" and b:
            b[min(pos, len(b) - 1)] ^= draw(st.integers(1, 255))
        else:
            b[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        data[i] = bytes(b)
    return data


class _Session:
    """What a RemoteAgent needs of a session, without a server: an inbox, limits, liveness."""

    def __init__(self, limits: wire.Limits):
        self.inbox: queue.Queue = queue.Queue()
        self.limits, self.last_seen = limits, float("inf")
        self.writer = wire.FrameWriter(pb.ControllerFrame)

    def send(self, frame: Any, blobs: Any = None) -> None:
        pass

    def end(self) -> None:
        pass


def controller_takes(plan: Plan, stream: list[bytes], limits: wire.Limits = LIMITS) -> str:
    """Feed one agent's byte frames to the controller's reader and window handle, as the server does.

    Returns how it ended: "accepted", "refused: ..." (a parse error, a WireError, an AgentFailure).
    Raises anything else (a crash), or AssertionError when more memory was taken than the limits allow.
    """
    reader = wire.FrameReader(pb.AgentFrame, limits)
    sess = _Session(limits)
    h = RemoteAgent(1, sess, plan, 0, lambda: None, 1.0, lambda a: "")
    h._window = 1
    tracemalloc.start()
    try:
        try:
            for data in stream:
                try:
                    frame = pb.AgentFrame.FromString(data)
                except Exception as e:  # noqa: BLE001 - protobuf's DecodeError: gRPC refuses the message
                    return f"refused: not a frame ({type(e).__name__})"
                msg = reader.feed(frame)
                assert reader.held <= limits.max_pending_bytes
                if msg is not None:
                    sess.inbox.put(("frame", msg, reader.hand_over()))
            if sess.inbox.empty():
                return "refused: incomplete"
            r = h.end_advance()
            _write(plan, r)
            return "accepted"
        except (wire.WireError, AgentFailure) as e:
            return f"refused: {type(e).__name__}"
        finally:
            peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        assert peak < 4 * limits.max_pending_bytes + (8 << 20), f"{peak} bytes traced"


def _write(plan: Plan, r: Any) -> None:
    """What the controller does with an accepted Reached: its rows go to the run directory's writers."""
    import tempfile
    from pathlib import Path

    from agents.observe.statelog import StateLogWriter
    from agents.observe.trace import TRACE_KIND, TraceWriter
    from controller.outputs import RunDir

    with tempfile.TemporaryDirectory() as d:
        out, tw, sl = RunDir(Path(d)), TraceWriter(Path(d) / "trace.json", plan.names, plan.placement), \
            StateLogWriter(d)
        out.write_updates([row for _, row in r.updates])
        out.write_evals([row for _, row in r.evals])
        for key, kind, name, fields in r.events:
            (tw.add(fields) if kind == TRACE_KIND else sl.add(key, kind, name, fields))
        out.close()
        tw.close()
        sl.close()


def agent_takes(event: pb.Event) -> str:
    """An agent decoding an inbound event (its blobs and direct references refused): WireError or a value."""
    def no_peer(agent: int, bid: int, nbytes: int) -> Any:
        raise wire.WireError("no direct stream here")

    try:
        wire.decode_event(pb.Event.FromString(event.SerializeToString()), {}, no_peer)
        return "accepted"
    except wire.WireError:
        return "refused: WireError"


# ------------------------------------------------------------ direct windows
@st.composite
def mesh_streams(draw: Any) -> bytes:
    """What a peer might send on a direct-window stream (agents/mesh.py): frames of a prefix, a
    MeshReport (random times, routing entries and events), a tensor table and tensor bytes; some bytes
    mangled, the stream ending anywhere."""
    from agents.mesh import _BLOB, _PREFIX
    from protos.lockstep.v1 import mesh_pb2 as mpb

    from agents.sim.types import INFINITY

    times = st.one_of(st.just(INFINITY), st.integers(0, 10_000), ANY_INT)  # INFINITY: the peer is done
    out = bytearray()
    for k in range(draw(st.integers(1, 3))):
        rep = mpb.MeshReport(window=draw(st.sampled_from([k, k, k, k + 1, -1])), next_time=draw(times),
                             horizon=draw(times))
        if draw(st.booleans()):
            rep.stop_time = draw(ANY_INT)
        for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
            rep.routed.add(agent=draw(st.integers(-1, 3)), count=draw(SMALL), min_time=draw(times),
                           min_effect=draw(times))
        for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
            draw(events(rep.events.add()))
        body = rep.SerializeToString()
        sizes = draw(st.lists(st.one_of(st.integers(0, 64), st.just(LIMITS.max_blob_bytes + 1), INT64),
                              max_size=draw(st.sampled_from([0, 2, 20]))))
        ids = [draw(st.one_of(st.integers(-1, 4), INT64)) for _ in sizes]
        out += _PREFIX.pack(len(body), len(sizes)) + body + b"".join(_BLOB.pack(i, n) for i, n in zip(ids, sizes))
        exact = sum(n for n in sizes if 0 <= n <= 64)
        # the tensors' bytes: as many as announced, or too few, or too many
        out += draw(st.one_of(st.binary(min_size=exact, max_size=exact), st.binary(max_size=128)))
    if draw(st.booleans()):  # truncate, flip or insert
        pos = draw(st.integers(0, max(len(out), 1)))
        how = draw(st.sampled_from(["truncate", "flip", "insert"]))
        if how == "truncate":
            del out[pos:]
        elif how == "flip" and out:
            out[min(pos, len(out) - 1)] ^= draw(st.integers(1, 255))
        else:
            out[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(out)


class _IdleCore:
    """Agent 0 of a two-agent run hosting vworker 0 (agent 1 hosts 1 and 2): its windows produce nothing."""

    agent_id = 0

    def advance(self, *a: Any, **k: Any) -> Any:
        from agents.core import Reached
        from agents.sim.types import INFINITY

        return Reached(INFINITY, [], None, INFINITY)


def mesh_takes(data: bytes, limits: wire.Limits = LIMITS) -> str:
    """Feed agent 1's stream to agent 0's direct-window loop (real sockets, the real reader and checks).

    Returns "accepted" (the windows ran to their end) or "refused: MeshError"; raises anything else (a
    crash), or AssertionError when more memory was taken than the limits allow.
    """
    import socket

    from agents.mesh import MeshError, MeshLinks, MeshLoop
    from agents.sim.types import INFINITY

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    tracemalloc.start()
    links = MeshLinks(0, {1: a}, limits=limits)
    try:
        try:
            b.sendall(data)
            b.close()  # the peer is done: the stream ends after its bytes
            loop = MeshLoop(_IdleCore(), links, placement=[0, 1, 1], n_agents=2, lookahead=1000,
                            next_times=[INFINITY, 5], horizons=[INFINITY, 5], report=lambda p: None)
            loop.run()
            return "accepted"
        except MeshError:
            return "refused: MeshError"
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            links.close()
    finally:
        tracemalloc.stop()
        assert peak < 4 * limits.max_pending_bytes + (8 << 20), f"{peak} bytes traced"


# ------------------------------------------------------------------ configs
CONF = __import__("pathlib").Path(__file__).resolve().parents[2] / "conf"
GROUPS = {g: sorted(p.stem for p in (CONF / g).glob("*.yaml") if not p.stem.startswith("_")) + ["nope", "../x"]
          for g in ("strategy", "model", "network", "compute", "launcher")}
VALUES = ["-1", "0", "1", "2", "3", "64", "1000000000000", "9223372036854775808", "0.5", "-0.0", "1e-9", "inf",
          "nan", "1e999", "abc", "10ms", "250us", "2s", "-5ms", "1Gbit/s", "100MB/s", "0bit/s", "fifo", "fair",
          "unlimited", "cpu", "cuda", "cuda:7", "round_robin", "ps_alone", "iid", "dirichlet", "''", "null", "true",
          "false", "[]", "[1,2]", "[a]", "[0.1,0.2,0.3]", "[[1,2],[3,4]]", "{}", "{a:1}",
          "{distribution:normal,mean:1,std:2}", "{distribution:weibull,scale:1,shape:0}", "{classes:[]}",
          "${workers}", "${nope}", "[[", "=", "a b", "'x,y'", "os.system", "torch.load", "agents.strategies.ps.PSAsync"]


def config_leaves() -> list[str]:
    """Every settable key of the default config (dotted), from the schema and conf/."""
    from omegaconf import OmegaConf

    from controller.config import compose_config

    cfg = OmegaConf.to_container(compose_config([]), resolve=False, enum_to_str=True)
    out: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out.append(prefix)
    walk({k: v for k, v in cfg.items() if k != "hydra"}, "")
    return out


@st.composite
def overrides(draw: Any, leaves: list[str]) -> list[str]:
    """One to four overrides: a key set to a value (valid or not), a group choice, an added or deleted key."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "set", "set", "group", "add", "delete"]))
        if kind == "group":
            g = draw(st.sampled_from(sorted(GROUPS)))
            out.append(f"{g}={draw(st.sampled_from(GROUPS[g]))}")
        elif kind == "add":
            out.append(f"+{draw(st.sampled_from(['foo', 'strategy.extra', 'network.latency.x']))}="
                       f"{draw(st.sampled_from(VALUES))}")
        elif kind == "delete":
            out.append(f"~{draw(st.sampled_from(leaves))}")
        else:
            value = draw(st.one_of(st.sampled_from(VALUES), st.integers(-(1 << 64), 1 << 64).map(str),
                                   st.floats().map(repr)))
            out.append(f"{draw(st.sampled_from(leaves))}={value}")
    return out


def one_sentence(text: str) -> bool:
    return bool(text) and "\n" not in text and text.rstrip().endswith(".") and len(text) < 600 \
        and "Traceback" not in text


def config_outcome(ovr: list[str]) -> str:
    """"refused" with one clear sentence per problem, or "accepted" once the run's plan is built.

    Anything else (an exception other than ConfigError) is a crash and propagates.
    """
    from controller.config import ConfigError, load
    from controller.plan import make_plan

    try:
        rc = load(ovr)
    except ConfigError as e:
        assert e.problems and all(one_sentence(p) for p in e.problems), e.problems
        return "refused"
    make_plan(rc)
    return "accepted"
