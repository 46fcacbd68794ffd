"""Fuzzed inputs (issue 13 item 4): malformed, truncated and oversized frames and wire values are refused —
never a crash of the controller or an agent, never more memory than the plan allows, never corrupted outputs.

A few hundred examples here; ``python benchmarks/bench_fuzz.py`` tries tens of thousands (docs/benchmarks.md).
"""
from __future__ import annotations

import random
import threading

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.common import wire
from controller.server import ControllerServer, ControllerSettings
from protos.lockstep.v1 import agent_pb2 as pb
from tests.distributed.conftest import assert_same_outputs, run
from tests.distributed.fakes import TOKEN, register_metadata

from .fuzzing import agent_takes, controller_takes, events, frame_streams

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])


@FUZZ
@given(stream=frame_streams())
def test_fuzzed_agent_frames_are_accepted_or_refused_never_a_crash(plan, stream):
    assert controller_takes(plan, stream).startswith(("accepted", "refused"))


@FUZZ
@given(event=st.builds(pb.Event).flatmap(lambda e: events(e).map(lambda _: e)))
def test_fuzzed_controller_events_decode_or_raise_a_wire_error_in_an_agent(event):
    assert agent_takes(event).startswith(("accepted", "refused"))


class _Noise(threading.Thread):
    """Throws random bytes and metadata at every method of a controller until stopped."""

    def __init__(self, address: str, seed: int):
        super().__init__(daemon=True)
        self.address, self.rng, self.stop, self.sent = address, random.Random(seed), threading.Event(), 0

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as ch:
            while not self.stop.is_set():
                method = self.rng.choice(["Register", "Session", "Beat", "Nope"])
                call = ch.stream_stream(f"/lockstep.v1.Controller/{method}", request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
                md = self.rng.choice([(), register_metadata(self.rng.randrange(-1, 4), token=self.rng.choice(
                    ["", "x", TOKEN[:-1]])), (("lockstep-agent-id", "0"), ("lockstep-ticket", "guess"))])
                body = [self.rng.randbytes(self.rng.randrange(0, 200)) for _ in range(self.rng.randrange(0, 3))]
                try:
                    list(call(iter(body), metadata=md, timeout=5))
                except grpc.RpcError:
                    pass
                self.sent += 1


def test_a_run_under_a_stream_of_fuzzed_calls_gives_the_same_outputs(tmp_path, monkeypatch):
    noise: list[_Noise] = []

    class Noisy(ControllerServer):  # the noise starts as soon as the controller listens
        def start(self) -> str:
            address = super().start()
            noise.append(_Noise(address, 17))
            noise[-1].start()
            return address

    monkeypatch.setattr("controller.remote.ControllerServer", Noisy)
    over = ["strategy=ps_async", "workers=2", "stop.updates=30", "placement=round_robin"]
    run(tmp_path / "quiet", over + ["agents=1"])
    try:
        r = run(tmp_path / "noisy", over + ["agents=2"], local=True)
    finally:
        for n in noise:
            n.stop.set()
            n.join(10)
    assert noise and noise[0].sent > 20
    assert r.summary["updates"] == 30
    assert_same_outputs(tmp_path / "quiet", tmp_path / "noisy")


@pytest.mark.parametrize("seed", range(3))
def test_random_bytes_on_an_authenticated_session_fail_only_that_session(plan, seed):
    rng = random.Random(seed)
    s = ControllerServer(TOKEN, plan.run_id, plan.to_json(), 64, ControllerSettings())
    s.start()
    try:
        with grpc.insecure_channel(s.address) as ch:
            for aid in range(16):
                from tests.distributed.fakes import register

                a = register(s, agent_id=aid)
                raw = ch.stream_stream("/lockstep.v1.Controller/Session", request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
                frames = [rng.randbytes(rng.randrange(1, 300)) for _ in range(rng.randrange(1, 4))]
                try:
                    list(raw(iter(frames), timeout=10,
                             metadata=((wire.METADATA_AGENT, str(aid)), (wire.METADATA_TICKET, a.ticket))))
                except grpc.RpcError:
                    pass
        assert register(s, agent_id=63).agent_id == 63  # still serving
    finally:
        s.stop(grace=0)
