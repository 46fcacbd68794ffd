"""Findings 1, 2, 3, 6, 7 and 8 of the review (issue 17; docs/security.md): every one reproduced as an attacker
would — all traffic on 127.0.0.1 — and refused. Each test failed on the code before the fix."""
from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc

import grpc
import pytest
import torch

from agents.agent import EXIT_FAILED, AgentProcess
from agents.common import wire
from agents.direct import DirectServer
from controller.config import validate
from controller.launchers.base import AgentFailure
from controller.launchers.local import LocalLauncher
from controller.remote import RemoteAgents
from controller.run import execute
from controller.server import ControllerServer, ControllerSettings
from protos.lockstep.v1 import agent_pb2 as pb
from tests.distributed.conftest import FAST, agents_env
from tests.distributed.fakes import TOKEN, fake_agent, handle, register, register_metadata
from tests.helpers import compose_cfg, wait_until

REGISTER = "/lockstep.v1.Controller/Register"


def _raw(channel: grpc.Channel, method: str = REGISTER):
    return channel.stream_stream(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)


def _stalled(release: threading.Event):
    """A request stream that sends nothing and never ends (until ``release``)."""
    release.wait()
    return
    yield  # pragma: no cover - makes this a generator


# --------------------------------------------------------------------------- finding 1
class _StrangersFirst(LocalLauncher):
    """Before starting the agents, strangers open ``n`` Register calls and never send their request."""

    def __init__(self, n: int, **kw):
        super().__init__(**kw)
        self.n, self.release, self.calls = n, threading.Event(), []

    def start(self, spec) -> None:
        self.channel = grpc.insecure_channel(spec.controller_address)
        self.calls = [_raw(self.channel)(_stalled(self.release), timeout=120) for _ in range(self.n)]
        super().start(spec)


def test_a_flood_of_stalled_registrations_does_not_stop_a_run(tmp_path):
    strangers = _StrangersFirst(40)
    pool = RemoteAgents(strangers, ControllerSettings(heartbeat_s=0.5, agent_timeout_s=30), extra_env=agents_env())
    rc = validate(compose_cfg(FAST + ["workers=2", "agents=2", "stop.updates=20"]))
    try:
        r = execute(rc, tmp_path, launcher=pool)
        # each stranger was refused from its metadata, without the controller waiting for its request (a
        # connection takes 16 streams at a time: calls queued behind them may still be waiting when the run ends)
        codes = [c.code() for c in strangers.calls if c.done()]
        assert codes.count(grpc.StatusCode.UNAUTHENTICATED) >= 16 and grpc.StatusCode.OK not in codes
    finally:
        strangers.release.set()
        strangers.channel.close()
    assert r.summary["updates"] == 20


def test_a_token_holder_who_never_sends_its_request_is_cut_off_and_cannot_hoard_calls(plan):
    # the deadline is long enough for the second call to meet the first still holding the slot on a loaded host
    s = ControllerServer(TOKEN, plan.run_id, plan.to_json(), plan.n_agents, ControllerSettings(call_timeout_s=5.0))
    s.start()
    release = threading.Event()
    try:
        with grpc.insecure_channel(s.address) as ch:
            first = _raw(ch)(_stalled(release), metadata=register_metadata(0), timeout=30)
            # the server holds the slot (not just the client's call started): on a loaded host the second call
            # must not reach the server first, nor after the first was already cut off
            wait_until(lambda: s.refusals.total == 0 and s.gate.in_flight.get(("Register", 0)) == 1, timeout=5,
                       what="the server to hold the first call")
            second = _raw(ch)(_stalled(release), metadata=register_metadata(0), timeout=30)
            with pytest.raises(grpc.RpcError) as e:
                next(second)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # one Register per agent at a time
            with pytest.raises(grpc.RpcError) as e:
                next(first)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "did not arrive within 5 s" in e.value.details()
            assert register(s, agent_id=0).agent_id == 0  # the slot is free again
    finally:
        release.set()
        s.stop(grace=0)


def test_refused_callers_are_counted_in_a_bounded_log(server):
    for i in range(200):
        with pytest.raises(grpc.RpcError):
            register(server, token=f"guess-{i}")
    assert server.refusals.total == 200 and server.refusals.by_code["UNAUTHENTICATED"] == 200
    assert len(server.refusals.recent) <= 32 and not server.sessions


# --------------------------------------------------------------------------- finding 2
@pytest.mark.parametrize("row", [
    ((5, 0, 1), "state.version", "w0", {"version": 1}),  # vworker 0 lives on agent 0, not 1
    ((5, 1, 1), "state.version", "../../escape", {"version": 1, "params": torch.zeros(4)}),
    ((5, 1, 1), "state.version", "/tmp/escape", {"version": 1, "params": torch.zeros(4)}),
    ((5, 2, 1), "state.model", "ps0", {"server": "nobody", "version": 1}),
    ((5, 1, 1), "data.fetch", "w1", {"hits": 1, "misses": -5, "bytes": 0, "wait_ns": 0}),
    ((5, 1, 1), "data.fetch", "w1", {"hits": 1, "misses": 0, "bytes": 0, "wait_ns": 0, "extra": "x"}),
    ((5, 1, 1), "fault.crash", "w1", {"until": None, "restart": True}),  # the plan has no crash fault
    ((5, 1, 1), "fault.recover", "w1", {"note": "x"}),
    ((5, 1, 1), "state.evil", "w1", {"version": 1}),  # lockstep's own prefix: not a strategy's record
    ((5, 1, 1), "rtt", "w1", {"ns": torch.zeros(1 << 10)}),  # a strategy's record holds plain values only
    ((5, 1, 1), "rtt", "w1", {"t": 1}),  # would overwrite the line's own time
    ((5, 1, 1), "../rtt", "w1", {}),
], ids=["not-its-vworker", "dotdot", "absolute", "unknown-peer", "negative-fetch", "odd-fetch", "uncrashed",
        "odd-recover", "own-prefix", "custom-tensor", "custom-t", "custom-path"])
def test_a_hostile_agent_cannot_report_rows_for_vworkers_it_does_not_host(server, plan, row):
    def hostile(adv):
        f = pb.AgentFrame()
        f.reached.window, f.reached.next_time, f.reached.horizon = adv.window, 2**63 - 1, 2**63 - 1
        wire.encode_value([row], f.reached.events)
        return f

    t = fake_agent(server, 1, hostile)  # agent 1 hosts vworker 1 (w1) under round_robin
    h = handle(server, plan, 1)
    with pytest.raises(AgentFailure, match="sent a malformed Reached: events"):
        h.advance(1000, [], None, None)
    h.close()
    t.join(10)


def test_crash_records_are_accepted_for_crashed_vworkers_only_and_with_their_fields_types():
    from controller.checks import RowError, check_rows
    from controller.config import load
    from controller.plan import make_plan

    rc = load(FAST + ["workers=2", "agents=2", "stop.updates=2", "faults=[{kind:crash,workers:[w1],at:1ms}]"],
              check_data=False)
    p = make_plan(rc, run_id="test-run")  # agent 1 hosts w1 (vworker 1) under round robin
    good = [((5, 1, 1), "fault.crash", "w1", {"until": None, "restart": True}),
            ((6, 1, 2), "fault.crash", "w1", {"until": 9, "restart": False}),
            ((9, 1, 3), "fault.recover", "w1", {})]
    check_rows(p, 1, [], [], good, 1 << 20)
    for fields, what in [({"until": -1, "restart": True}, "field 'until' is -1"),
                         ({"until": 1.5, "restart": True}, "field 'until' is 1.5"),
                         ({"until": None, "restart": 1}, "field 'restart' is 1"),
                         ({"restart": True}, r"exactly the fields \['restart', 'until'\]")]:
        with pytest.raises(RowError, match=what):
            check_rows(p, 1, [], [], [((5, 1, 1), "fault.crash", "w1", fields)], 1 << 20)


def test_a_strategys_own_records_hold_plain_values_under_a_name_of_its_own():
    from agents.sim.records import OWN_KINDS, check_custom_record
    from agents.observe.trace import TRACE_KIND
    from agents.sim.faults import FAULT_RECORDS
    from agents.workloads.datanet import FETCH_KIND
    from controller.checks import STATE_FIELDS

    assert OWN_KINDS == {TRACE_KIND, FETCH_KIND, *STATE_FIELDS, *FAULT_RECORDS}  # the recorder skips these
    check_custom_record("rtt", {"ns": 22_000_000, "loss": 0.5, "ok": True, "peer": "pong", "note": None})
    check_custom_record("my.metric_2", {})
    check_custom_record("sent", {"params": 3, "version": "v2"})  # the state log's snapshot fields mean nothing here
    for kind, fields, what in [
            ("trace", {}, "not lockstep's own"), ("fault.mine", {}, "not lockstep's own"), ("a b", {}, "is not valid"),
            (7, {}, "is not valid"), ("x" * 65, {}, "is not valid"),
            ("rtt", {f"f{i}": 0 for i in range(33)}, "at most 32 fields"),
            ("rtt", {"vworker": "w0"}, "other than t, vworker and kind"), ("rtt", {"a-b": 1}, "field name"),
            ("rtt", {"ns": 1 << 63}, "64-bit int"), ("rtt", {"x": float("nan")}, "finite float"),
            ("rtt", {"x": "y" * 257}, "at most 256 characters"), ("rtt", {"x": [1]}, "is not valid")]:
        with pytest.raises(ValueError, match=what):
            check_custom_record(kind, fields)


def test_a_strategy_that_records_a_bad_record_is_told_where_it_calls_the_recorder():
    from agents.sim.env import Recorder

    class W:
        id, name, now = 0, "w0", 5

    r = Recorder()
    r.event(W(), "rtt", ns=3)
    r.event(W(), "state.model", server="ps0", version=1)  # lockstep's own: checked by the controller
    with pytest.raises(ValueError, match=r"field x=tensor"):
        r.event(W(), "rtt", x=torch.zeros(2))
    assert [e[1:] for e in r.events] == [("rtt", "w0", {"ns": 3}), ("state.model", "w0", {"server": "ps0",
                                                                                           "version": 1})]


def test_a_snapshot_named_to_leave_the_run_directory_is_refused_and_nothing_is_written(tmp_path):
    from agents.observe.statelog import StateLogWriter

    run = tmp_path / "run"
    run.mkdir()
    w = StateLogWriter(run)
    for name in ("../escape", "../../escape", str(tmp_path / "escape"), ".hidden"):
        with pytest.raises(ValueError, match="vworker name"):
            w.add((5, 1, 1), "state.version", name, {"version": 1, "params": torch.zeros(4)})
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == []


def test_malformed_event_rows_fail_the_agent_with_a_clear_error(server, plan):
    def odd(adv):
        f = pb.AgentFrame()
        f.reached.window, f.reached.next_time, f.reached.horizon = adv.window, 2**63 - 1, 2**63 - 1
        wire.encode_value([(1, 2)], f.reached.events)
        return f

    t = fake_agent(server, 1, odd)
    h = handle(server, plan, 1)
    with pytest.raises(AgentFailure, match=r"events must be a list of \(key, kind, vworker, fields\)"):
        h.advance(1000, [], None, None)
    h.close()
    t.join(10)


# --------------------------------------------------------------------------- finding 3
def _chunk(total: int, data: bytes = b"x" * 10) -> pb.AgentFrame:
    f = pb.AgentFrame()
    f.chunk.blob, f.chunk.total, f.chunk.offset, f.chunk.data = 1, total, 0, data
    return f


def test_a_ten_byte_chunk_declaring_a_gibibyte_is_refused_and_allocates_nothing():
    r = wire.FrameReader(pb.AgentFrame)
    tracemalloc.start()
    try:
        with pytest.raises(wire.WireError, match="announces 1073741824 bytes"):
            r.feed(_chunk(1 << 30))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak} bytes allocated for a 10-byte chunk"


def test_blobs_grow_as_their_chunks_arrive_and_what_is_held_is_bounded():
    r = wire.FrameReader(pb.AgentFrame, wire.Limits(max_blob_bytes=1 << 20, max_pending_bytes=64, max_pending_blobs=2))
    r.feed(_chunk(1 << 20))
    assert len(r.partial[1][0]) == 10  # what arrived, not the declared megabyte
    f = _chunk(1 << 20, b"y" * 60)
    f.chunk.blob = 2
    with pytest.raises(wire.WireError, match="more than 64 bytes of blobs held"):
        r.feed(f)


def test_the_controller_refuses_a_chunk_above_the_plans_limit_at_once(server, plan):
    t = fake_agent(server, 1, lambda adv: _chunk(1 << 30))
    h = handle(server, plan, 1)
    t0 = time.monotonic()
    with pytest.raises(AgentFailure, match="announces 1073741824 bytes"):
        h.advance(1000, [], None, None)
    assert time.monotonic() - t0 < 5
    t.join(10)


def test_a_direct_stream_announcing_a_huge_blob_fails_at_once():
    from agents.direct import _HEADER, _HELLO, MAGIC, pair_key

    s = DirectServer("127.0.0.1", agent_id=1)
    try:
        host, port = s.address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as c:
            c.sendall(_HELLO.pack(MAGIC, 0, pair_key(s.secret, 0, 1)) + _HEADER.pack(7, 1 << 36))
            t0 = time.monotonic()
            with pytest.raises(wire.WireError, match="announces a blob of 68719476736 bytes"):
                s.take(0, 7, 1 << 36, timeout_s=30)
            assert time.monotonic() - t0 < 5
    finally:
        s.close()


# --------------------------------------------------------------------------- finding 6
def _connect(s: DirectServer) -> socket.socket:
    host, port = s.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)))


def test_three_hundred_connections_without_a_hello_cost_no_thread_each_and_a_real_sender_still_gets_through():
    from agents.direct import MAX_UNAUTHENTICATED, DirectLinks, pair_key

    s = DirectServer("127.0.0.1", agent_id=1)
    before = threading.active_count()
    socks = [_connect(s) for _ in range(300)]
    try:
        wait_until(lambda: sum(s.refused.values()) >= 300 - MAX_UNAUTHENTICATED, timeout=30,
                   what="the server to turn the connections away")
        assert threading.active_count() <= before + 1
        links = DirectLinks(0, {1: (s.address, pair_key(s.secret, 0, 1))})
        assert links.usable(1)
        links.send(1, 1, memoryview(b"abc"))
        assert bytes(s.take(0, 1, 3, timeout_s=10)) == b"abc"
        links.close()
    finally:
        for c in socks:
            c.close()
        s.close()


def test_a_hello_dribbled_a_byte_at_a_time_is_cut_off_at_its_deadline(monkeypatch):
    import agents.direct as direct

    monkeypatch.setattr(direct, "HELLO_TIMEOUT_S", 0.5)
    s = DirectServer("127.0.0.1", agent_id=1)
    try:
        c = _connect(s)
        t0 = time.monotonic()

        def closed() -> bool:
            try:
                c.send(b"L")
                c.settimeout(0.1)
                return c.recv(1) == b""
            except socket.timeout:
                return False
            except OSError:
                return True
        wait_until(closed, timeout=10, interval=0.1, what="the server to close the dribbling connection")
        assert time.monotonic() - t0 < 3
        assert s.refused["no hello within 0.5 s"] == 1
        c.close()
    finally:
        s.close()


def test_a_spoofed_hello_cannot_speak_for_another_agent():
    from agents.direct import _HELLO, MAGIC, DirectLinks, pair_key

    s = DirectServer("127.0.0.1", agent_id=1)
    try:
        # agent 2 knows its own key for agent 1, claims to be agent 0 with it, then hangs up
        with _connect(s) as c:
            c.sendall(_HELLO.pack(MAGIC, 0, pair_key(s.secret, 2, 1)))
        wait_until(lambda: s.refused["wrong hello or key"] == 1, timeout=10, what="the spoofed hello to be refused")
        real = DirectLinks(0, {1: (s.address, pair_key(s.secret, 0, 1))})
        assert real.usable(1)
        real.send(1, 1, memoryview(b"genuine"))
        assert bytes(s.take(0, 1, 7, timeout_s=10)) == b"genuine"  # agent 0 was never taken for lost
        real.close()
    finally:
        s.close()


def test_a_reused_blob_id_fails_the_stream_instead_of_overwriting():
    from agents.direct import DirectLinks, pair_key

    s = DirectServer("127.0.0.1", agent_id=1)
    try:
        links = DirectLinks(0, {1: (s.address, pair_key(s.secret, 0, 1))})
        assert links.usable(1)
        links.send(1, 3, memoryview(b"first"))
        links.send(1, 3, memoryview(b"other"))
        wait_until(lambda: 0 in s._lost, timeout=10, what="the stream to fail")
        assert "reuses blob id 3" in s._lost[0]
        assert bytes(s.take(0, 3, 5, timeout_s=1)) == b"first"
        links.close()
    finally:
        s.close()


# --------------------------------------------------------------------------- finding 7
def test_an_agent_never_imports_a_class_a_forged_plan_names(plan, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    monkeypatch.setenv("LOCKSTEP_TEST_MARKER", str(marker))
    forged = json.loads(plan.to_json())
    forged["vworkers"][0]["cls"] = "tests.security.evil.Marker"
    s = ControllerServer(TOKEN, plan.run_id, json.dumps(forged), plan.n_agents)
    s.start()
    try:
        assert AgentProcess(s.address, 0, plan.run_id, TOKEN, connect_timeout_s=10).run() == EXIT_FAILED
        kind, msg, _ = s.sessions[0].inbox.get(timeout=10)
        assert msg.WhichOneof("body") == "failure"
        assert "tests.security.evil.Marker" in msg.failure.error and "--trust-module" in msg.failure.error
    finally:
        s.stop(grace=0)
    assert not marker.exists(), "the agent imported a module the plan named"


def test_with_tls_an_agent_refuses_a_controller_it_cannot_verify_and_sends_it_nothing(plan, pki):
    from agents.common.trust import AgentTLS
    from controller.config.schema import TLSConfig

    stranger = pki["stranger"]  # a certificate from someone else's CA, at the controller's address
    s = ControllerServer(TOKEN, plan.run_id, plan.to_json(), plan.n_agents,
                         ControllerSettings(tls=TLSConfig(enabled=True, cert=str(stranger.cert), key=str(stranger.key),
                                                            client_auth=False)))
    s.start()
    try:
        node = pki["node"]
        tls = AgentTLS(ca=str(pki["ca"].path), cert=str(node.cert), key=str(node.key))
        assert AgentProcess(s.address, 0, plan.run_id, TOKEN, connect_timeout_s=3, tls=tls).run() == EXIT_FAILED
        assert not s.sessions and s.refusals.total == 0  # no call ever reached it: the token was never sent
    finally:
        s.stop(grace=0)


# --------------------------------------------------------------------------- finding 8
@pytest.mark.parametrize("numpy", [True, False])
def test_a_zero_sized_tensor_with_an_absurd_shape_is_a_wire_error(numpy):
    v = pb.Value()
    v.tensor.dtype, v.tensor.numpy = "float32", numpy
    v.tensor.shape.extend([0, 2**62])
    with pytest.raises(wire.WireError, match="shape"):
        wire.decode_value(v)


def test_a_tensor_with_too_many_dimensions_is_a_wire_error():
    v = pb.Value()
    v.tensor.dtype = "float32"
    v.tensor.shape.extend([1] * 40)
    v.tensor.data = b"\0" * 4
    with pytest.raises(wire.WireError, match="at most 32 dimensions"):
        wire.decode_value(v)
    assert wire.decode_value(pb.Value(tensor=pb.Tensor(dtype="float32", shape=[1] * 8, data=b"\0" * 4))).dim() == 8


def test_a_strategys_record_with_a_field_named_params_is_a_line_not_a_snapshot(tmp_path):
    from agents.observe.statelog import StateLogWriter
    from agents.sim.env import RowKey

    w = StateLogWriter(tmp_path)
    w.add(RowKey(5, 1, 1), "sent", "w1", {"params": 3})
    w.close()
    assert (tmp_path / "statelog.jsonl").read_text() == '{"t":5,"vworker":"w1","kind":"sent","params":3}\n'
    assert not (tmp_path / "snapshots").exists()
