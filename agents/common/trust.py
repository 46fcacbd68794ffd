"""What an agent trusts: the controller it dials (TLS) and the classes a plan may make it import.

An agent sends its token to whoever answers at the controller address and then
imports and calls the class paths the plan names (docs/security.md). So:

* :class:`AgentTLS` — with ``$LOCKSTEP_TLS_CA`` (set by the launchers from
  ``controller.tls``) the agent verifies the controller's certificate before it
  sends anything, and presents its own (``$LOCKSTEP_TLS_CERT`` / ``_KEY``) for
  mutual TLS; the direct tensor streams between agents use the same files.
* :class:`Trust` — a plan may name only lockstep's own strategies and models
  (``agents.strategies.*``, ``agents.workloads.models.*``) unless the agent was
  started with more modules (``$LOCKSTEP_TRUST_MODULES``, ``--trust-module``).
  The launchers set that variable to the modules of the user's own config, so
  the agents they start accept it; a forged plan from another address cannot
  widen it.
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

__all__ = ["AgentTLS", "Trust", "UntrustedClass", "BUILTIN_MODULES", "TRUST_ENV", "modules_to_trust",
           "client_ssl_context", "server_ssl_context"]

BUILTIN_MODULES = ("agents.strategies", "agents.workloads.models")
TRUST_ENV = "LOCKSTEP_TRUST_MODULES"
TLS_ENV = {"ca": "LOCKSTEP_TLS_CA", "cert": "LOCKSTEP_TLS_CERT", "key": "LOCKSTEP_TLS_KEY",
           "server_name": "LOCKSTEP_TLS_SERVER_NAME"}
_SHORT_MODELS = ("mlp", "cnn", "resnet")


class UntrustedClass(ValueError):
    """A plan (or a run directory) names a class outside the modules this process trusts."""


def _module_of(path: str) -> str:
    return path.rpartition(".")[0]


def _under(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _targets(node: Any) -> Iterable[str]:
    """Every ``_target_`` in a nested config (Hydra instantiates nested ones too)."""
    if isinstance(node, dict):
        t = node.get("_target_")
        if t is not None:
            yield t if isinstance(t, str) else repr(t)
        for v in node.values():
            yield from _targets(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            yield from _targets(v)


@dataclass(frozen=True)
class Trust:
    """Module prefixes whose classes a plan may name, beyond lockstep's own."""

    modules: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, extra: Iterable[str] = ()) -> "Trust":
        env = [m.strip() for m in os.environ.get(TRUST_ENV, "").split(",") if m.strip()]
        return cls(tuple(dict.fromkeys([*env, *extra])))

    def allows(self, path: str) -> bool:
        module = _module_of(path)
        return bool(module) and _under(module, BUILTIN_MODULES + self.modules)

    def check(self, path: str, what: str, hint: str | None = None) -> None:
        if not self.allows(path):
            hint = hint or (f"start the agent with --trust-module {_module_of(path) or path} "
                            f"(or ${TRUST_ENV}) if you trust it")
            raise UntrustedClass(f"{what} names {path!r}, which is not one of lockstep's strategies or models; "
                                 f"{hint}")

    def check_model(self, model: Any, what: str = "model._target_", hint: str | None = None) -> None:
        for target in _targets(model):
            if target not in _SHORT_MODELS:
                self.check(target, what, hint)

    def check_plan(self, plan: Any) -> None:
        """Raise UntrustedClass when the plan names a class this agent was not told to trust."""
        for spec in plan.vworkers:
            self.check(spec.cls, f"the plan's vworker {spec.name}")
        self.check_model(plan.workload.model, "the plan's model")


def modules_to_trust(plan: Any) -> list[str]:
    """The modules outside lockstep's own that ``plan`` names: what its launcher tells its agents to trust."""
    paths = [v.cls for v in plan.vworkers]
    paths += [t for t in _targets(plan.workload.model) if t not in _SHORT_MODELS]
    return sorted({_module_of(p) for p in paths if not _under(_module_of(p), BUILTIN_MODULES)})


# ------------------------------------------------------------------ TLS
@dataclass(frozen=True)
class AgentTLS:
    """The agent's side of ``controller.tls``: files from the environment (or ``lockstep agent`` flags)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    @classmethod
    def from_env(cls, **flags: str | None) -> "AgentTLS":
        return cls(**{k: flags.get(k) or os.environ.get(env) or None for k, env in TLS_ENV.items()})

    @property
    def enabled(self) -> bool:
        return self.ca is not None

    def env(self) -> dict[str, str]:
        """The environment that gives an agent process these settings."""
        return {TLS_ENV[k]: v for k, v in (("ca", self.ca), ("cert", self.cert), ("key", self.key),
                                            ("server_name", self.server_name)) if v}

    def channel(self, grpc_mod: Any, target: str, options: list[tuple[str, Any]]) -> Any:
        """A channel to the controller (``grpc_mod`` is ``grpc`` or ``grpc.aio``): TLS when a CA is set."""
        if not self.enabled:
            return grpc_mod.insecure_channel(target, options=options)
        import grpc

        creds = grpc.ssl_channel_credentials(
            root_certificates=Path(self.ca).read_bytes(),
            private_key=Path(self.key).read_bytes() if self.key else None,
            certificate_chain=Path(self.cert).read_bytes() if self.cert else None)
        opts = list(options)
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        return grpc_mod.secure_channel(target, creds, options=opts)


def client_ssl_context(ca: str, cert: str | None, key: str | None) -> ssl.SSLContext:
    """A direct stream's sending side: verify the receiving agent against ``ca``, present our certificate.

    Agents are addressed by IP (pod addresses are not in certificates), so the chain is checked, not
    the host name; which agent is at the other end is proven by the per-pair key of the hello.
    """
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def server_ssl_context(ca: str, cert: str, key: str | None) -> ssl.SSLContext:
    """A direct stream's receiving side: our certificate; a sender must present one signed by ``ca``."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(cert, key)
    return ctx


def check_pair(ca: str, cert: str, key: str | None) -> tuple[str, str] | None:
    """Whether ``cert`` and ``key`` belong together and ``ca`` signed ``cert``, checked by a TLS handshake in
    memory (no socket); None when they do, else (``"key"`` or ``"ca"``: the file at fault, and why)."""
    try:
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as e:
        return "key", f"{getattr(e, 'reason', None) or e}"
    try:
        client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    except (ssl.SSLError, OSError) as e:
        return "ca", f"{getattr(e, 'reason', None) or e}"
    client.check_hostname = False  # the chain, not the name: controller.tls.server_name may name another
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(to_client, to_server)
    s_ = server.wrap_bio(to_server, to_client, server_side=True)
    done = [False, False]
    for _ in range(8):
        for i, side in enumerate((c, s_)):
            if done[i]:
                continue
            try:
                side.do_handshake()
                done[i] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as e:
                return "ca", e.verify_message or str(e)
            except ssl.SSLError as e:
                return "ca", f"{e.reason or e}"
        if all(done):
            return None
    return "ca", "the handshake did not finish"
