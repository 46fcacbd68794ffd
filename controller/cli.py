"""The ``lockstep`` command: ``run`` (a Hydra app over conf/), ``plot``, ``agent``, ``inspect``."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

__all__ = ["main"]

def _conf_dir() -> str:
    """conf/ of the source tree, or the copy a regular install ships as the ``conf`` package."""
    source_tree = Path(__file__).resolve().parent.parent / "conf"
    if (source_tree / "config.yaml").is_file():
        return str(source_tree)
    import conf

    return str(Path(conf.__file__).resolve().parent)


CONF_DIR = _conf_dir()
USAGE = """usage: lockstep <command> [args]

commands:
  run [overrides...]        run an experiment (Hydra: key=value overrides, --multirun to sweep)
  plot RUN_OR_SWEEP_DIR...  draw loss/accuracy vs virtual time and iterations (and throughput for sweeps)
  agent --controller HOST:PORT --agent-id N   an agent process (started by launchers)
  inspect RUN --at T [--worker W]             what a vworker was doing and holding at virtual time T
"""


def main(argv: list[str] | None = None) -> int:
    from controller import signals

    signals.install()  # first: Ctrl-C / SIGTERM exit now, or stop a started run gracefully (controller/signals.py)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "run":
        return _run(rest)
    if cmd == "plot":
        from controller.plotcli import main as plot_main

        return plot_main(rest)
    if cmd == "agent":
        from agents.__main__ import main as agent_main

        return agent_main(rest)
    if cmd == "inspect":
        from controller.inspect import main as inspect_main

        return inspect_main(rest)
    print(f"lockstep: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


def _run(overrides: list[str]) -> int:
    import hydra

    if not any(o.startswith("-") for o in overrides):  # flags (--multirun, --cfg): Hydra's own handling
        problem = _override_problem(overrides)
        if problem:
            print(f"lockstep: invalid configuration:\n  {problem}", file=sys.stderr)
            return 2
    sys.argv = ["lockstep run", *overrides]
    hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")(_task)()
    return 0


def _override_problem(overrides: list[str]) -> str | None:
    """One sentence when Hydra cannot compose the config from ``overrides`` (syntax, unknown key or option)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            compose(config_name="config", overrides=overrides)
    except MissingConfigException as e:
        group = (e.missing_cfg_file or "").rpartition("/")[0]
        bad = next((o for o in overrides if o.split("=", 1)[0].lstrip("+~") == group), group)
        return (f"{bad} names no config; accepted: {' | '.join(e.options)}." if e.options else
                f"{bad}: {str(e).splitlines()[0]}.")
    except OverrideParseException as e:
        return (f"cannot parse an override ({str(e).splitlines()[0]}); accepted: key=value "
                "(https://hydra.cc/docs/advanced/override_grammar/basic).")
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        if first.startswith("Ambiguous value for argument"):
            return (f"{first.split(' ', 4)[-1]} has several values; accepted: a list as key=[a,b], or a sweep of "
                    "runs with --multirun.")
        if first.startswith("Could not override"):
            key = first.split("'")[1]
            return (f"{key} is not a configuration key; accepted: the keys of conf/config.yaml "
                    f"(docs/configuration.md), or +{key}=VALUE to add one.")
        return f"{first.rstrip('.')}."
    return None


def _task(cfg) -> dict:
    from hydra.core.hydra_config import HydraConfig

    from controller.config import ConfigError, validate

    try:
        rc = validate(cfg)
    except ConfigError as e:
        print("lockstep: invalid configuration:", file=sys.stderr)
        for p in e.problems:
            print(f"  {p}", file=sys.stderr)
        sys.exit(2)
    logging.getLogger().setLevel(rc.log_level)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    from controller.session import run_session

    result = run_session(rc, run_dir)
    return result.summary


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
