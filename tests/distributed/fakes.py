"""A controller with a fixed plan, and fake agents speaking the protocol by hand (hostile ones too).

Shared by the protocol tests (tests/distributed) and the security tests (tests/security).
"""
from __future__ import annotations

import threading

import grpc
import pytest

from agents.common import wire
from agents.common.plan import Plan
from controller.plan import make_plan
from controller.remote import RemoteAgent
from controller.server import ControllerServer, ControllerSettings
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import agent_pb2_grpc as pb_grpc

from tests.helpers import wait_until

FAST = ["model=mlp", "compute=constant", "eval.every=0", "progress=false", "launcher=inprocess"]

TOKEN = "s3cret-token"


@pytest.fixture
def plan() -> Plan:
    from controller.config import load

    rc = load(FAST + ["workers=2", "agents=2", "stop.updates=2"], check_data=False)
    return make_plan(rc, run_id="test-run")


@pytest.fixture
def server(plan):
    s = ControllerServer(TOKEN, plan.run_id, plan.to_json(), plan.n_agents, ControllerSettings(max_message_bytes=1 << 16))
    s.start()
    yield s
    s.stop(grace=0)


def register_metadata(agent_id: int = 0, token: str = TOKEN, protocol_version: int = wire.PROTOCOL_VERSION):
    return ((wire.METADATA_TOKEN, token), (wire.METADATA_PROTOCOL, str(protocol_version)),
            (wire.METADATA_AGENT, str(agent_id)))


def register(server, token: str = TOKEN, **kw):
    req = dict(agent_id=0, protocol_version=wire.PROTOCOL_VERSION, run_id="test-run")
    req.update(kw)
    md = register_metadata(req["agent_id"], token, req["protocol_version"])
    with grpc.insecure_channel(server.address) as ch:
        return pb_grpc.ControllerStub(ch).Register(pb.RegisterRequest(**req), metadata=md, timeout=10)


def fake_agent(server, agent_id: int, reached_for) -> threading.Thread:
    """An agent that answers every Advance with ``reached_for(advance)`` (a pb.AgentFrame)."""
    a = register(server, agent_id=agent_id)
    writer = wire.FrameWriter(pb.AgentFrame, 1 << 16)

    def main():
        import queue

        q: queue.Queue = queue.Queue()
        first = pb.AgentFrame()
        first.ready.next_time = 0
        q.put(first)

        def reqs():
            while (f := q.get()) is not None:
                yield f

        with grpc.insecure_channel(server.address) as ch:
            stream = pb_grpc.ControllerStub(ch).Session(
                reqs(), metadata=(("lockstep-agent-id", str(agent_id)), ("lockstep-ticket", a.ticket)))
            try:
                for frame in stream:
                    if frame.WhichOneof("body") == "advance":
                        for f in writer.frames(reached_for(frame.advance)):
                            q.put(f)
                    elif frame.WhichOneof("body") == "shutdown":
                        break
            except grpc.RpcError:
                pass
            q.put(None)

    t = threading.Thread(target=main, daemon=True)
    t.start()
    return t


def handle(server, plan, agent_id) -> RemoteAgent:
    sess = wait_until(lambda: server.sessions.get(agent_id) if server.sessions.get(agent_id) and
                      server.sessions[agent_id].attached else None, timeout=10, what="the session")
    kind, msg, _ = sess.inbox.get(timeout=10)
    assert msg.WhichOneof("body") == "ready"
    return RemoteAgent(agent_id, sess, plan, 0, lambda: None, 10.0, lambda a: "")


