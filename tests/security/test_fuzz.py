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

from . import fuzzing
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


@FUZZ
@given(data=fuzzing.mesh_streams())
def test_fuzzed_direct_window_streams_run_or_fail_with_a_mesh_error_never_a_crash(data):
    assert fuzzing.mesh_takes(data).startswith(("accepted", "refused"))


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


LEAVES = fuzzing.config_leaves()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(ovr=fuzzing.overrides(LEAVES))
def test_fuzzed_configs_give_a_plan_or_one_clear_sentence_per_problem(ovr):
    assert fuzzing.config_outcome(ovr) in ("accepted", "refused")


CLI_SAMPLE = [["workers=[["], ["strategy=nope"], ["foo=1"], ["network.latency=-5ms", "workers=0"],
              ["batch_size=[1,2]"], ["workers=1,2"], ["~workers"], ["network.bandwidth={distribution:weibull}"],
              ["compute=distribution"], ["seed=9223372036854775808"], ["network=wan", "workers=3"]]


@pytest.mark.parametrize("ovr", CLI_SAMPLE, ids=[" ".join(o) for o in CLI_SAMPLE])
def test_the_cli_runs_a_config_or_exits_2_with_one_sentence_never_a_traceback(ovr, tmp_path):
    import subprocess
    import sys

    small = ["model=mlp", "compute=constant", "stop.updates=3", "eval.every=0", "progress=false",
             "launcher=inprocess", "trace.mode=off"]
    p = subprocess.run([sys.executable, "-m", "controller.cli", "run", *small, *ovr, f"hydra.run.dir={tmp_path}"],
                       cwd=fuzzing.CONF.parent, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in p.stderr, p.stderr
    if p.returncode == 2:
        head, *problems = p.stderr.strip().splitlines()
        assert head == "lockstep: invalid configuration:" and problems
        assert all(fuzzing.one_sentence(x.strip()) for x in problems), p.stderr
    else:
        assert p.returncode == 0, p.stderr[-2000:]
        assert (tmp_path / "summary.json").exists()
