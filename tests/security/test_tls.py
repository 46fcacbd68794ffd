"""Optional TLS (issue 13 item 5): mutual TLS on the gRPC service and the direct tensor streams.

Certificates come from files (tests/security/certs.py makes them as cert-manager would: tls.crt, tls.key,
ca.crt); on Kubernetes they come from a Secret (docs/kubernetes.md).
"""
from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from agents.common import wire
from controller.config import ConfigError, load
from controller.config.schema import TLSConfig
from controller.server import ControllerServer, ControllerSettings
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import agent_pb2_grpc as pb_grpc
from tests.distributed.conftest import FAST, assert_same_outputs, run
from tests.distributed.fakes import TOKEN, register_metadata

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _tls_server(plan, pki) -> ControllerServer:
    node = pki["node"]
    s = ControllerServer(TOKEN, plan.run_id, plan.to_json(), plan.n_agents, ControllerSettings(
        tls=TLSConfig(enabled=True, cert=str(node.cert), key=str(node.key), ca=str(pki["ca"].path), client_auth=True)))
    s.start()
    return s


def _register(address: str, creds: grpc.ChannelCredentials | None, agent_id: int = 0):
    ch = grpc.secure_channel(address, creds) if creds is not None else grpc.insecure_channel(address)
    with ch:
        return pb_grpc.ControllerStub(ch).Register(
            pb.RegisterRequest(agent_id=agent_id, protocol_version=wire.PROTOCOL_VERSION, run_id="test-run"),
            metadata=register_metadata(agent_id), timeout=10)


def test_with_mtls_a_client_without_a_valid_certificate_is_refused(plan, pki):
    s = _tls_server(plan, pki)
    ca = pki["ca"].path.read_bytes()
    stranger, node = pki["stranger"], pki["node"]
    try:
        for creds in (None,  # plaintext
                      grpc.ssl_channel_credentials(root_certificates=ca),  # TLS, but no certificate of its own
                      grpc.ssl_channel_credentials(ca, stranger.key.read_bytes(), stranger.cert.read_bytes())):
            with pytest.raises(grpc.RpcError) as e:
                _register(s.address, creds)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not s.sessions and s.refusals.total == 0  # turned away by TLS, before any call existed
        good = grpc.ssl_channel_credentials(ca, node.key.read_bytes(), node.cert.read_bytes())
        assert _register(s.address, good).agent_id == 0
    finally:
        s.stop(grace=0)


def _tls_overrides(pki) -> list[str]:
    node = pki["node"]
    return ["controller.tls.enabled=true", f"controller.tls.cert={node.cert}", f"controller.tls.key={node.key}",
            f"controller.tls.ca={pki['ca'].path}"]


@pytest.mark.parametrize("windows, streams", [
    ("hub", "direct stream to agent"),  # tensors on the direct streams, windows through the controller
    ("direct", "direct windows: streams to agents [0] open (mutual TLS)"),  # everything between the agents
])
def test_a_run_with_tls_on_gives_the_same_outputs(tmp_path, pki, windows, streams):
    over = ["strategy=ps_async", "workers=2", "stop.updates=30", "agents=2", "placement=round_robin"]
    run(tmp_path / "plain", over + ["agents=1"])
    d = tmp_path / "tls"
    proc = subprocess.run([sys.executable, "-m", "controller.cli", "run", *FAST, *over, "launcher=local",
                           f"controller.windows={windows}", *_tls_overrides(pki), f"hydra.run.dir={d}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(TLS)" in (d / "lockstep.log").read_text()
    # the model (636 kB) travels on the agents' own streams, which speak TLS too
    assert streams in (d / "agents" / "agent-1.log").read_text()
    assert_same_outputs(tmp_path / "plain", d)


@pytest.mark.parametrize("override, problem", [
    (["controller.tls.enabled=true"], "controller.tls.cert=null is not valid; accepted: a PEM file"),
    (["controller.tls.enabled=true", "controller.tls.cert=/nonexistent.crt", "controller.tls.key=/nonexistent.key",
      "controller.tls.ca=/nonexistent.ca"], "controller.tls.cert=/nonexistent.crt is not valid; accepted: a readable"),
    (["controller.tls.enabled=maybe"], "controller.tls.enabled=maybe is not valid; accepted: true | false"),
])
def test_a_wrong_tls_setting_is_one_clear_sentence(override, problem):
    with pytest.raises(ConfigError) as e:
        load(FAST + override)  # as `lockstep run` checks it: the files of this machine are looked at
    assert any(p.startswith(problem) for p in e.value.problems), e.value.problems


def test_a_key_of_another_certificate_or_a_ca_that_did_not_sign_it_is_refused_before_anything_starts(pki):
    """Found running the CLI: the wrong CA made the agents fail after 65 s with DEADLINE_EXCEEDED, a key of
    another certificate a traceback saying the controller could not bind its port."""
    node, stranger, other = pki["node"], pki["stranger"], pki["other_ca"]
    base = ["controller.tls.enabled=true", f"controller.tls.cert={node.cert}", f"controller.tls.ca={pki['ca'].path}"]
    load(FAST + base + [f"controller.tls.key={node.key}"])  # the right files: valid
    with pytest.raises(ConfigError) as e:
        load(FAST + base + [f"controller.tls.key={stranger.key}"])
    assert e.value.problems == [f"controller.tls.key={stranger.key} is not valid; accepted: the private key of "
                                f"controller.tls.cert={node.cert} (loading the pair failed: KEY_VALUES_MISMATCH)."]
    wrong_ca = ["controller.tls.enabled=true", f"controller.tls.cert={node.cert}", f"controller.tls.key={node.key}",
                f"controller.tls.ca={other.path}"]
    with pytest.raises(ConfigError) as e:
        load(FAST + wrong_ca)
    assert e.value.problems == [f"controller.tls.ca={other.path} is not valid; accepted: the CA that signed "
                                f"controller.tls.cert={node.cert} (verifying it failed: unable to get local issuer "
                                "certificate)."]
    with pytest.raises(ConfigError) as e:  # the agents' own pair, which local agents read on this machine
        load(FAST + base + [f"controller.tls.key={node.key}", "launcher=local", "agents=2",
                            f"controller.tls.agent_cert={stranger.cert}", f"controller.tls.agent_key={stranger.key}"])
    assert e.value.problems == [f"controller.tls.ca={pki['ca'].path} is not valid; accepted: the CA that signed "
                                f"controller.tls.agent_cert={stranger.cert} (verifying it failed: unable to get local "
                                "issuer certificate)."]

