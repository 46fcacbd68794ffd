"""The ``lockstep`` command: ``run`` (a Hydra app over conf/), ``plot``, ``agent``, ``inspect``."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

__all__ = ["main"]

USAGE = """usage: lockstep <command> [args]

commands:
  run [overrides...]        run an experiment (Hydra: key=value overrides, --multirun to sweep)
  sweep [--kubernetes] [overrides...]   a Hydra sweep; --kubernetes: one Helm release per point
  fetch RELEASE [DIR] | --sweep NAME [DIR]  copy run directories out of a cluster's results volume
  profile --name NAME [overrides...]   measure this machine's compute calls into a device profile
  predict [--json] [overrides...]      the throughput the experiment should reach, by the paper's models
  plot RUN_OR_SWEEP_DIR...  draw loss/accuracy vs virtual time and iterations (and throughput for sweeps)
  agent --controller HOST:PORT --agent-id N   an agent process (started by launchers)
  inspect RUN --at T [--worker W]             what a vworker was doing and holding at virtual time T
  validate RESULTS.jsonl [overrides...] [--json]   emulate measured runs, print measured vs emulated
  calibrate RESULTS.jsonl [--out conf/network/NAME.yaml]   fit the tcp transport's parameters to measured runs
  measure [--out RESULTS.jsonl] [options]     run real torch.distributed microbenchmarks, write RESULTS.jsonl
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
    if cmd == "sweep":
        from controller.cluster import sweep_main

        return sweep_main(rest)
    if cmd == "fetch":
        from controller.cluster import fetch_main

        return fetch_main(rest)
    if cmd == "profile":
        from controller.config.profiles import profile_main

        return profile_main(rest)
    if cmd == "predict":
        from controller.predict import predict_main

        return predict_main(rest)
    if cmd == "plot":
        from controller.plotcli import main as plot_main

        return plot_main(rest)
    if cmd == "agent":
        from agents.__main__ import main as agent_main

        return agent_main(rest)
    if cmd == "inspect":
        from controller.inspect import main as inspect_main

        return inspect_main(rest)
    if cmd == "validate":
        from controller.validate import main as validate_main

        return validate_main(rest)
    if cmd == "calibrate":
        from controller.calibrate import main as calibrate_main

        return calibrate_main(rest)
    if cmd == "measure":
        from controller.measure import main as measure_main

        return measure_main(rest)
    print(f"lockstep: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2


_HYDRA_FLAGS = {"--multirun", "-m", "--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i", "--resolve",
                "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                "--experimental-rerun", "--version", "--run", "-r", "--shell-completion", "-sc"}


def _invalid(problems: list[str]) -> None:
    print("lockstep: invalid configuration:", file=sys.stderr)
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    sys.exit(2)


def _preflight(args: list[str]) -> None:
    """Validate the run, or every job of a sweep, before Hydra starts anything (exit 2 with every problem)."""
    from controller.config import ConfigError, check_sweep, load, sweep_jobs

    overrides = [a for a in args if not a.startswith("-")]
    if any(a.startswith("-") and a.split("=")[0] not in _HYDRA_FLAGS for a in args):
        return  # an option only Hydra knows: let it answer
    try:
        if "--multirun" in args or "-m" in args:
            check_sweep(sweep_jobs(overrides))
        elif not any(a in args for a in ("--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i")):
            load(overrides)
    except ConfigError as e:
        _invalid(e.problems)


def _run(args: list[str]) -> int:
    import hydra

    from controller.config import CONF_DIR, register_configs

    register_configs()
    _preflight(args)
    sys.argv = ["lockstep run", *args]
    hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")(_task)()
    return 0


def _task(cfg) -> dict:
    from hydra.core.hydra_config import HydraConfig

    from controller.config import ConfigError, validate

    try:
        rc = validate(cfg)
    except ConfigError as e:  # (the preflight has checked it; a sweeper of another kind may not have)
        _invalid(e.problems)
    logging.getLogger().setLevel(rc.log_level)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    from controller.session import run_session

    result = run_session(rc, run_dir)
    return result.summary


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
