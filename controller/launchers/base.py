"""What every launcher implements; the controller drives agents only through this."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a launcher needs to start the agents of one run."""

    run_id: str
    n_agents: int
    controller_address: str  # host:port the agents dial
    token: str  # shared secret the agents present at Register
    run_dir: Path
    log_level: str = "INFO"
    extra_env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = 0  # fixed port of each agent's /metrics (0: none fixed; a free one if serving)

    def agent_argv(self, agent_id: int) -> list[str]:
        """The command line of agent ``agent_id``; the token travels in $LOCKSTEP_TOKEN, never argv."""
        return ["lockstep", "agent", "--controller", self.controller_address,
                "--agent-id", str(agent_id), "--run-id", self.run_id, "--log-level", self.log_level]


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its class name when it has none): for one-sentence errors."""
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


class LauncherConfigError(ValueError):
    """The launcher's settings, or the cluster state they name, are wrong: permanent, reported like a config
    error (one sentence, exit status 2). Every launcher raises it for what the user must fix."""


class AgentFailure(RuntimeError):
    """An agent died, could not start, or stopped answering. Names the agent and why.

    ``lost``: the agent's process died or fell silent (not an error it reported, nor a malformed message):
    what ``recovery.agents=restart`` recovers from (docs/recovery.md).
    """

    def __init__(self, agent: str, reason: str, log_tail: str = "", lost: bool = False):
        self.agent, self.reason, self.log_tail, self.lost = agent, reason, log_tail, lost
        msg = f"agent {agent} failed: {reason}"
        if log_tail:
            msg += "\n--- last log lines ---\n" + log_tail
        super().__init__(msg)


class Launcher(Protocol):
    def start(self, spec: LaunchSpec) -> None:
        """Start ``spec.n_agents`` agents; returns once they are created (not yet registered)."""

    def check(self) -> None:
        """Raise AgentFailure if any agent has failed; cheap enough to call every second."""

    def stop(self, restart: bool = False) -> None:
        """Stop and remove every agent (idempotent; also on failure or Ctrl-C).

        A launcher with ``restartable = True`` may be started again after ``stop`` (a lost agent,
        docs/recovery.md); ``restart=True`` says that a ``start`` follows at once, so it may keep what
        belongs to no one set of agents (Ray's connection and private cluster). A later ``stop()``
        releases that too.
        """
