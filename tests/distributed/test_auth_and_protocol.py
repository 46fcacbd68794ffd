"""Register refuses bad tokens and protocol versions; malformed frames never crash the controller."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from agents.common import wire
from agents.agent import EXIT_REFUSED, AgentProcess
from controller.launchers.base import AgentFailure
from controller import server as server_mod
from controller.server import ControllerServer, ControllerSettings
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import agent_pb2_grpc as pb_grpc

from .conftest import ROOT, wait_until
from .fakes import TOKEN, fake_agent, handle, register

@pytest.mark.parametrize("token", ["", "wrong", TOKEN + "x"])
def test_a_missing_or_wrong_token_is_refused_unauthenticated(server, token):
    with pytest.raises(grpc.RpcError) as e:
        register(server, token=token)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "token" in e.value.details()
    assert server.sessions == {}, "a refused client must not touch the run"


def test_an_incompatible_protocol_version_is_refused_failed_precondition(server):
    with pytest.raises(grpc.RpcError) as e:
        register(server, protocol_version=wire.PROTOCOL_VERSION + 1)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"version {wire.PROTOCOL_VERSION + 1}" in e.value.details()
    assert server.sessions == {}


def test_the_agent_process_exits_with_refused_status_on_a_wrong_token(server):
    assert AgentProcess(server.address, 0, "test-run", "nope", connect_timeout_s=10).run() == EXIT_REFUSED
    assert AgentProcess(server.address, 0, "test-run", TOKEN, protocol_version=99,
                        connect_timeout_s=10).run() == EXIT_REFUSED
    assert server.sessions == {}


def test_a_session_without_the_ticket_is_refused(server):
    register(server)
    with grpc.insecure_channel(server.address) as ch:
        stream = pb_grpc.ControllerStub(ch).Session(iter([pb.AgentFrame()]), timeout=10,
                                                    metadata=(("lockstep-agent-id", "0"), ("lockstep-ticket", "x")))
        with pytest.raises(grpc.RpcError) as e:
            list(stream)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert not server.sessions[0].attached


def test_a_beat_needs_the_sessions_ticket(server):
    a = register(server)
    server.sessions[0].last_seen = 0.0
    with grpc.insecure_channel(server.address) as ch:
        beat = pb_grpc.ControllerStub(ch).Beat
        with pytest.raises(grpc.RpcError) as e:
            beat(pb.Heartbeat(sent_unix_ns=1), timeout=10, metadata=(("lockstep-agent-id", "0"), ("lockstep-ticket", "x")))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert server.sessions[0].last_seen == 0.0, "a refused beat must not keep the agent alive"
        assert beat(pb.Heartbeat(sent_unix_ns=7), timeout=10,
                    metadata=(("lockstep-agent-id", "0"), ("lockstep-ticket", a.ticket))).sent_unix_ns == 7
    assert server.sessions[0].last_seen > 0.0


def test_garbage_bytes_on_the_stream_fail_that_session_only(server):
    a = register(server, agent_id=0)
    with grpc.insecure_channel(server.address) as ch:
        raw = ch.stream_stream("/lockstep.v1.Controller/Session", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
        call = raw(iter([b"\xff\xfe garbage \x00\x01"]), timeout=10,
                   metadata=(("lockstep-agent-id", "0"), ("lockstep-ticket", a.ticket)))
        with pytest.raises(grpc.RpcError):
            list(call)
    kind, reason = wait_until(lambda: server.sessions[0].closed.is_set() and server.sessions[0].inbox.get(),
                              timeout=10, what="the session to close")
    assert kind == "closed"
    # the controller still serves: another agent registers fine
    assert register(server, agent_id=1).agent_id == 1


def test_a_plan_larger_than_the_message_limit_still_reaches_the_agent(plan):
    """A 100 000-client FedAvg plan is 17 MB of JSON, above the default 16 MiB limit: the Assignment that
    carries it may exceed the limit (agents' messages may not). Before, registration failed RESOURCE_EXHAUSTED."""
    big = plan.to_json()[:-1] + ', "padding": "' + "x" * 300_000 + '"}'  # 4.6 x this server's 64 KiB limit
    s = ControllerServer(TOKEN, plan.run_id, big, plan.n_agents, ControllerSettings(max_message_bytes=1 << 16))
    s.start()
    try:
        assert register(s, agent_id=0).plan_json == big
    finally:
        s.stop(grace=0)


def test_an_agent_ahead_of_a_slow_controller_is_held_back_and_loses_nothing(server):
    """An agent streaming progress faster than the controller takes it (a 10 000-vworker run's first rows, a
    busy machine) is held back by the stream's flow control: the controller holds at most its inbox's frames
    and reads the rest as it takes them, in order. (It used to fail the session at the 17th frame.)"""
    a = register(server, agent_id=0)
    n = 3 * server_mod._INBOX_FRAMES
    done = threading.Event()

    def frames():
        for i in range(n):
            f = pb.AgentFrame()
            f.reached.window = i
            yield f.SerializeToString()
        done.wait(30)  # keep the stream open until the test has taken every frame

    with grpc.insecure_channel(server.address) as ch:
        raw = ch.stream_stream("/lockstep.v1.Controller/Session", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
        call = raw(frames(), timeout=30, metadata=(("lockstep-agent-id", "0"), ("lockstep-ticket", a.ticket)))
        try:
            sess = wait_until(lambda: server.sessions[0].attached and server.sessions[0], timeout=10,
                              what="the session")
            wait_until(lambda: sess.inbox.qsize() >= server_mod._INBOX_FRAMES, timeout=10, what="a full inbox")
            got = []
            while len(got) < n:
                assert sess.inbox.qsize() <= server_mod._INBOX_FRAMES
                item = sess.inbox.get(timeout=10)
                assert item[0] == "frame", f"the session ended after {len(got)} frames: {item[1]}"
                got.append(item[1].reached.window)
            assert got == list(range(n))
            assert not sess.closed.is_set()
        finally:
            done.set()
            call.cancel()


def test_a_reached_for_an_unknown_vworker_is_rejected_with_a_clear_error(server, plan):
    def bogus(adv):
        f = pb.AgentFrame()
        f.reached.window, f.reached.next_time = adv.window, 2**63 - 1
        ev = f.reached.outbound.add(time=5, priority=0, origin=1, seq=1, dst=99, kind="notify")
        wire.encode_value((99, "x"), ev.value)
        return f

    t = fake_agent(server, 1, bogus)  # agent 1 hosts vworker 1 under round_robin
    h = handle(server, plan, 1)
    with pytest.raises(AgentFailure) as e:
        h.advance(1000, [], None, None)
    assert e.value.agent == "1" and "unknown vworker 99" in str(e.value)
    h.close()
    t.join(10)
    assert register(server, agent_id=0).agent_id == 0  # the controller still serves


def test_a_reached_with_a_wrong_tensor_size_is_rejected(server, plan):
    def bad_tensor(adv):
        f = pb.AgentFrame()
        f.reached.window, f.reached.next_time = adv.window, 2**63 - 1
        ev = f.reached.outbound.add(time=5, priority=0, origin=1, seq=1, dst=0, kind="notify")
        ev.value.tensor.dtype = "float32"
        ev.value.tensor.shape.extend([1000])
        ev.value.tensor.data = b"\x00" * 12
        return f

    t = fake_agent(server, 1, bad_tensor)
    h = handle(server, plan, 1)
    with pytest.raises(AgentFailure, match="malformed Reached: tensor of shape"):
        h.advance(1000, [], None, None)
    h.close()
    t.join(10)


def test_the_generated_protobuf_code_is_fresh(tmp_path):
    subprocess.run(["bash", str(ROOT / "scripts/gen-protos.sh"), str(tmp_path)], check=True,
                   env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    gen = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert gen, "the generator wrote nothing"
    for rel in gen:
        committed = ROOT / rel
        assert committed.exists(), f"{rel} is generated but not committed"
        assert (tmp_path / rel).read_text() == committed.read_text(), \
            f"{rel} is stale: run scripts/gen-protos.sh and commit the result"
    assert {p.name for p in (ROOT / "protos/lockstep/v1").glob("*_pb2*.py*")} == {Path(r).name for r in gen}


def test_a_reached_claiming_a_horizon_before_its_next_event_is_rejected(server, plan):
    def early(adv):
        f = pb.AgentFrame()
        f.reached.window, f.reached.next_time, f.reached.horizon = adv.window, 500, 400
        return f

    t = fake_agent(server, 1, early)
    h = handle(server, plan, 1)
    with pytest.raises(AgentFailure, match="horizon 400 before its next event 500"):
        h.advance(1000, [], None, None)
    h.close()
    t.join(10)


def test_an_event_claiming_to_act_before_it_arrives_is_rejected(server, plan):
    def early(adv):
        f = pb.AgentFrame()
        f.reached.window, f.reached.next_time, f.reached.horizon = adv.window, 2**63 - 1, 2**63 - 1
        ev = f.reached.outbound.add(time=5000, priority=0, origin=1, seq=1, dst=0, kind="notify", effect=10)
        wire.encode_value((0, "x"), ev.value)
        return f

    t = fake_agent(server, 1, early)
    h = handle(server, plan, 1)
    with pytest.raises(AgentFailure, match="malformed Reached: event at 5000 ns claims to act earlier, at 10 ns"):
        h.advance(1000, [], None, None)
    h.close()
    t.join(10)


def test_frames_for_a_stopped_server_are_dropped_without_an_error(plan, caplog):
    s = ControllerServer(TOKEN, plan.run_id, plan.to_json(), plan.n_agents)
    s.start()
    register(s, agent_id=0)
    sess = s.sessions[0]
    s.stop(grace=0)
    f = pb.ControllerFrame()
    f.shutdown.abort = True
    with caplog.at_level("DEBUG", logger="lockstep.controller"):
        sess.send(f)  # e.g. an abort after the server went down: nothing to deliver it to, nothing to raise
        sess.end()
    dropped = [r for r in caplog.records if "frame dropped, the server has stopped" in r.getMessage()]
    assert len(dropped) == 2  # the frame and the end of stream: neither raised, both were dropped


def test_the_session_stream_takes_one_write_at_a_time_from_both_of_its_writers():
    """grpc.aio allows one write at a time on a call. A checkpoint answered *ended* by the agent's loop while
    its direct windows' task still wrote its last frames made two at once: GRPC_CALL_ERROR_TOO_MANY_OPERATIONS,
    the agent took the controller for lost and exited (a clean-clone CI run, 2026-11-30). Both write through
    AgentProcess._write now."""
    import asyncio

    from agents.mesh import checkpoint_reply

    class Call:  # the stream: a write is in flight until the core has taken it
        def __init__(self):
            self.active = self.most = 0
            self.frames = []

        async def write(self, frame):
            self.active += 1
            self.most = max(self.most, self.active)
            await asyncio.sleep(0.001)
            self.frames.append(frame)
            self.active -= 1

    class Windows:  # the direct windows are over: the checkpoint is answered by the loop itself
        def checkpoint(self, call_id, window):
            return False

    agent = AgentProcess("127.0.0.1:1", 0, "test-run", TOKEN)
    agent.call, agent.mesh, agent.writer = Call(), Windows(), wire.FrameWriter(pb.AgentFrame)

    async def both():
        call = pb.Call(id=7, method="checkpoint")
        wire.encode_value((40,), call.args)
        progress = [f for _ in range(5) for f in checkpoint_reply(agent.writer, 3, "ok", 39, b"x" * 100)]
        await asyncio.gather(agent._checkpoint(call), *(agent._write(f) for f in progress))

    asyncio.run(both())
    assert agent.call.most == 1 and len(agent.call.frames) == 6
