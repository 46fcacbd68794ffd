"""``python -m agents`` / ``lockstep agent``: one agent process (see agents/agent.py).

usage: lockstep agent --controller HOST:PORT --agent-id N [--run-id R] [--log-level L] [--no-direct]
                      [--trust-module M] [--tls-ca F --tls-cert F --tls-key F [--tls-server-name N]]
The shared token is read from $LOCKSTEP_TOKEN (or the file named by $LOCKSTEP_TOKEN_FILE), never argv;
TLS files and trusted modules may also come from $LOCKSTEP_TLS_* and $LOCKSTEP_TRUST_MODULES.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from agents.observe.logs import configure_logging

__all__ = ["main", "forked"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lockstep agent", description="A lockstep agent process.")
    p.add_argument("--controller", required=True, help="HOST:PORT of the controller's gRPC service")
    p.add_argument("--agent-id", type=int, required=True)
    p.add_argument("--run-id", default="")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    p.add_argument("--connect-timeout", type=float, default=60.0, help="seconds to wait for the controller")
    p.add_argument("--no-direct", action="store_true",
                   help="send every tensor through the controller (no direct agent-to-agent streams); "
                        "also $LOCKSTEP_DIRECT=0")
    p.add_argument("--trust-module", action="append", default=[], metavar="MODULE",
                   help="also accept strategies and models from MODULE (repeatable; also $LOCKSTEP_TRUST_MODULES, "
                        "comma-separated); by default only lockstep's own")
    p.add_argument("--tls-ca", help="CA file: verify the controller (and peers) with TLS; also $LOCKSTEP_TLS_CA")
    p.add_argument("--tls-cert", help="this agent's certificate for mutual TLS; also $LOCKSTEP_TLS_CERT")
    p.add_argument("--tls-key", help="its private key; also $LOCKSTEP_TLS_KEY")
    p.add_argument("--tls-server-name", help="the name in the controller's certificate, when it is not the "
                                             "host dialled; also $LOCKSTEP_TLS_SERVER_NAME")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_level, process=f"agent-{args.agent_id}")
    log = logging.getLogger("lockstep.agent")
    token = os.environ.get("LOCKSTEP_TOKEN")
    if token is None and os.environ.get("LOCKSTEP_TOKEN_FILE"):
        try:
            with open(os.environ["LOCKSTEP_TOKEN_FILE"]) as f:
                token = f.read().strip()
        except OSError as e:
            log.error("cannot read the token file $LOCKSTEP_TOKEN_FILE: %s", e)
            return 3
    if not token:
        log.warning("no token in $LOCKSTEP_TOKEN; the controller will refuse this agent")
    from agents.agent import AgentProcess
    from agents.common.trust import AgentTLS, Trust

    tls = AgentTLS.from_env(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, server_name=args.tls_server_name)
    try:
        return AgentProcess(args.controller, args.agent_id, args.run_id, token or "",
                            connect_timeout_s=args.connect_timeout,
                            direct=not (args.no_direct or os.environ.get("LOCKSTEP_DIRECT") == "0"),
                            tls=tls, trust=Trust.from_env(args.trust_module)).run()
    except KeyboardInterrupt:
        log.warning("interrupted")
        return 130


def forked(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """The target of an agent forked by ``launcher=local`` (``start_method=forkserver``): :func:`agents.forked.run`,
    imported here only in the child, where the forkserver has imported it already."""
    from agents.forked import run

    run(argv, env, log_path)


def exit_now(code: int) -> None:
    """End an agent process: flush its logs and skip the interpreter's teardown (torch's takes ~1 s on a
    loaded machine), which the controller would otherwise wait for at the end of every run."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
