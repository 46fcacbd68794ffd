"""The ``lockstep`` command: ``run`` (a Hydra app over conf/), ``plot``, ``agent``, ``inspect``."""
from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]

USAGE = """usage: lockstep <command> [args]

commands:
  run [overrides...]        run an experiment (Hydra: key=value overrides, --multirun to sweep)
  resume RUN_DIR            finish a run whose controller died, bit-identical to an undisturbed run
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
    if cmd in ("predict", "inspect", "validate") and hasattr(signal, "SIGPIPE"):
        # a report read through `| head`: end quietly when the reader has gone, as other command-line tools do
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if cmd == "run":
        return _run(rest)
    if cmd == "resume":
        return _resume(rest)
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
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                "--experimental-rerun"}  # Hydra's flags that take the next argument as their value
_INFO_CHOICES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}  # --info's optional value
_COMPOSING = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun"}
_SHOWS = ("--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i")  # Hydra prints something and runs nothing


def _last_value(overrides: list[str], key: str) -> str | None:
    """The value the last ``key=value`` of ``overrides`` gives ``key`` (None: none does)."""
    values = [o.split("=", 1)[1] for o in overrides if o.startswith(key + "=")]
    return values[-1] if values else None


def _overrides_of(args: list[str]) -> list[str] | None:
    """The key=value overrides of a ``lockstep run`` command line, without the values of Hydra's flags
    (``--config-name config`` read ``config`` as an override); None when a flag changes what Hydra composes
    (another config, path or a rerun): the run validates what Hydra composes, and the preflight stands aside."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        flag = a.split("=")[0]
        if flag in _COMPOSING:
            return None
        if a in _VALUE_FLAGS or (a in ("--info", "-i") and i + 1 < len(args) and args[i + 1] in _INFO_CHOICES):
            i += 2
            continue
        if not a.startswith("-"):
            out.append(a)
        i += 1
    return out


def _invalid(problems: list[str]) -> None:
    print("lockstep: invalid configuration:", file=sys.stderr)
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    sys.exit(2)


def _preflight(args: list[str]) -> None:
    """Validate the run, or every job of a sweep, before Hydra starts anything (exit 2 with every problem)."""
    from controller.config import ConfigError, check_sweep, load, sweep_jobs, sweeper_params

    overrides = _overrides_of(args)
    if overrides is None or any(a.startswith("-") and a.split("=")[0] not in _HYDRA_FLAGS for a in args):
        return  # an option only Hydra knows, or another config: let Hydra answer
    try:
        if "--multirun" in args or "-m" in args:
            jobs = sweep_jobs(overrides)
            check_sweep(jobs)
            sweep_dir = _last_value(overrides, "hydra.sweep.dir")
            if sweep_dir is not None and not any(a in args for a in _SHOWS):
                _sweep_dir_ready(Path(sweep_dir), len(jobs))
        elif any(a.split("=")[0] in ("--cfg", "-c", "--info", "-i") for a in args):
            _composes(overrides)  # shown as composed, valid or not; a value Hydra cannot compose is one sentence
        elif not any(a in args for a in _SHOWS):
            rc = load(overrides)
            _warm(rc)
            run_dir = _last_value(overrides, "hydra.run.dir")
            if run_dir is not None:  # (a file there was Hydra's FileExistsError traceback)
                from controller.outputs import unwritable

                why = unwritable(run_dir, directory=True)
                if why:
                    _invalid([f"hydra.run.dir={run_dir}: {why}; accepted: a directory for the run's outputs."])
                if rc.recovery.resume.value == "auto":
                    _same_config_to_resume(rc, Path(run_dir))
            if any(o.lstrip("+~").startswith("experiment=") for o in overrides):
                grid = sweeper_params(overrides)
                if grid:  # a preset's sweep: one run of the config's own values would go unnoticed
                    print(f"lockstep: this experiment defines a sweep ({', '.join(f'{k}={v}' for k, v in grid.items())}"
                          "); without --multirun one run of the config's own values runs", file=sys.stderr)
    except ConfigError as e:
        _invalid(e.problems)


def _composes(overrides: list[str]) -> None:
    """``--cfg``/``--info``: Hydra shows the composed config, valid or not; one that cannot be composed (a value of
    the wrong type, an option that does not exist) was two tracebacks: one sentence each, exit 2, instead."""
    from controller.config.load import compose_checked

    _, problems, _ = compose_checked(overrides)  # (ConfigError when nothing composes: the caller's except)
    if problems:
        _invalid(problems)


def _sweep_dir_ready(sweep_dir: Path, n_jobs: int) -> None:
    """A ``hydra.sweep.dir`` the sweep can write (exit 2, one sentence, if not: it was Hydra's traceback); in one
    an earlier sweep used, its points beyond this sweep's ``n_jobs`` are removed, so that the directory holds
    this sweep alone (``lockstep plot`` drew them beside the new points, without a word)."""
    import shutil

    from controller.outputs import unwritable

    why = unwritable(str(sweep_dir), directory=True)
    if why:
        _invalid([f"hydra.sweep.dir={sweep_dir}: {why}; accepted: a directory for the sweep's points."])
    stale = sorted((p for p in sweep_dir.glob("*") if p.name.isdecimal() and int(p.name) >= n_jobs
                    and (p / ".hydra").is_dir()), key=lambda p: int(p.name)) if sweep_dir.is_dir() else []
    for p in stale:
        shutil.rmtree(p)
    if stale:
        print(f"lockstep: removed {len(stale)} point(s) of an earlier sweep from {sweep_dir} "
              f"({', '.join(p.name for p in stale)}): this sweep has {n_jobs}", file=sys.stderr)


def _same_config_to_resume(rc, run_dir: Path) -> None:
    """``recovery.resume=auto``: an unfinished run in ``run_dir`` resumes with its own config.yaml, so
    overrides that change it are refused (exit 2) rather than dropped without a word."""
    import yaml

    from controller.recovery import resume_state

    if resume_state(run_dir) != "unfinished":
        return
    try:
        theirs = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return  # resume says what is wrong with it
    from controller.config.validate import NOT_THE_EXPERIMENT as ignored

    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in (d or {}).items():
            if not prefix and k in ignored:
                continue
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    a, b = flat(theirs if isinstance(theirs, dict) else {}), flat(rc.raw)
    changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if changed:
        shown = ", ".join(f"{k}={b.get(k)!r} here, {a.get(k)!r} there" for k in changed[:4])
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        _invalid([f"recovery.resume=auto: {run_dir} holds an unfinished run of another config ({shown}{more}), "
                  "which would resume with its own; accepted: that run's config, or another hydra.run.dir."])


def _warm(rc) -> None:
    """A valid run with local agents: start their forkserver now, so that its imports overlap Hydra's set-up."""
    from controller.config.schema import LocalLauncherConfig

    if isinstance(rc.launcher, LocalLauncherConfig) and rc.launcher.start_method == "forkserver" and rc.agents > 1:
        from controller.launchers.forkserver import warm_forkserver

        warm_forkserver()


def _asks_for_local_agents(args: list[str]) -> bool:
    """What the command line alone says: several agents (``agents=N``, N > 1) on the local launcher (the
    default) forked from the forkserver (the default), one run. A guess from the words, before Hydra composes
    anything: an experiment preset that sets ``agents`` is found by :func:`_warm` instead, a little later. The
    defaults named here (``launcher: local``, ``start_method: forkserver``) repeat conf/config.yaml's and the
    schema's; a guess that goes wrong costs only an idle server, never a run's outcome."""
    if any(a in _HYDRA_FLAGS for a in args):  # a sweep, --cfg, --help...: not one run starting now
        return False
    values: dict[str, str] = {}
    for a in args:
        key, eq, value = a.lstrip("+~").partition("=")
        if eq:
            values[key] = value
    n = values.get("agents", "1")
    return (n.isdigit() and int(n) > 1 and values.get("launcher", "local") == "local"
            and values.get("launcher.start_method", "forkserver") == "forkserver")


def _run(args: list[str]) -> int:
    if _asks_for_local_agents(args):
        # the forkserver imports torch and the engine for ~1-2 s: from here that overlaps the controller's own
        # imports and the configuration's validation (~3 s) instead of delaying the agents' start
        # (docs/benchmarks.md, "Where the agents' start goes")
        from controller.launchers.forkserver import warm_forkserver

        warm_forkserver()
    import hydra

    from controller.config import CONF_DIR, register_configs

    register_configs()
    _preflight(args)
    sys.argv = ["lockstep run", *args]
    sweep = _SweepOutcome()
    hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")(sweep.task)()
    if sweep.failed:
        print(f"lockstep: {len(sweep.failed)} of {sweep.jobs} jobs of the sweep failed (each named above); the other "
              f"jobs' outputs are in {sweep.dir}", file=sys.stderr)
        return 1
    return 0


class _SweepOutcome:
    """The jobs of a ``--multirun`` that Hydra's basic launcher runs one after another in this process: a job
    that fails is reported in one line and the next one runs (a ``sys.exit`` of a job ended the sweep, and a
    traceback ended it after the last job, naming only the first failure); ``_run`` exits 1 naming how many
    failed. Jobs run elsewhere (``hydra/launcher=ray``) report to their launcher as before."""

    def __init__(self) -> None:
        self.jobs, self.failed, self.dir = 0, [], ""

    def task(self, cfg) -> dict:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN or hc.launcher.get("_target_") != _BASIC_LAUNCHER:
            return _task(cfg)
        self.jobs, self.dir = self.jobs + 1, hc.sweep.dir
        with _LastWords() as said:
            try:
                return _task(cfg)
            except SystemExit as e:
                if not e.code:
                    return {}
                if isinstance(e.code, int) and e.code >= 128:  # a signal (controller/signals.py): stop the sweep
                    raise
                reason = said.reason() or f"lockstep exited with status {e.code}"
            except Exception as e:  # noqa: BLE001 - a job's crash is that job's: the sweep goes on
                reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}".rstrip(": ")
                logs = _log_to_files(logging.ERROR, f"job {hc.job.num} failed", exc_info=(type(e), e, e.__traceback__))
                if logs:
                    reason += f" (the traceback is in {logs[0]})"
        line = f"job {hc.job.num} ({' '.join(hc.overrides.task)}) failed: {reason}"
        self.failed.append(line)
        print(f"lockstep: {line}", file=sys.stderr)
        return {"failed": reason}


_BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


class _LastWords:
    """Tees ``sys.stderr`` and keeps the last ``lockstep: ...`` message a job printed before it exited: the
    reason its one line names (session.py and the preflight print it, then ``sys.exit``)."""

    def __init__(self, keep: int = 200) -> None:
        from collections import deque

        self.lines: Any = deque(maxlen=keep)
        self.partial = ""

    def __enter__(self) -> "_LastWords":
        self.stream, sys.stderr = sys.stderr, self  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stderr = self.stream

    def write(self, text: str) -> int:
        import re

        self.stream.write(text)
        *done, self.partial = re.split(r"[\r\n]", self.partial + text)
        self.lines.extend(line for line in done if line.strip())
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding...: the stream's
        return getattr(self.stream, name)

    def reason(self) -> str:
        """The last message starting ``lockstep``, with the indented lines under a heading that ends in ':'."""
        lines = [*self.lines, self.partial] if self.partial.strip() else list(self.lines)
        at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("lockstep")), None)
        if at is None:
            return ""
        head = lines[at].split(": ", 1)[1] if ": " in lines[at] else lines[at]
        more = [x.strip() for x in lines[at + 1:] if x.startswith("  ")] if head.endswith(":") else []
        return f"{head} {'; '.join(more)}" if more else head


def _log_to_files(level: int, msg: str, exc_info: Any = None) -> list[str]:
    """``msg`` to the log files of the root logger (the job's lockstep.log) only; their paths."""
    record = logging.getLogger("lockstep").makeRecord("lockstep", level, __file__, 0, msg, (), exc_info)
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for h in files:
        h.handle(record)
    return [h.baseFilename for h in files]


class SweepJobFailed(RuntimeError):
    """A sweep job's lockstep exited with a non-zero status inside a Ray task (``hydra/launcher=ray``)."""


def _in_ray_task() -> bool:
    if "ray" not in sys.modules:  # (a job of hydra/launcher=ray has imported it)
        return False
    from controller.launchers.ray import in_ray_task

    return in_ray_task()


def _task(cfg) -> dict:
    try:
        return _run_task(cfg)
    except SystemExit as e:
        # Ray takes a task's SystemExit for its worker's crash and runs the job again (max_retries: three
        # more times, rewriting its run directory); an error of the job's own is not retried
        if e.code and _in_ray_task():
            raise SweepJobFailed(f"lockstep exited with status {e.code}; its lines above say why") from None
        raise


def _run_task(cfg) -> dict:
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_original_cwd

    from controller.config import ConfigError, validate
    from controller.config.load import absolute_paths

    absolute_paths(cfg, get_original_cwd())  # as the preflight read them, before hydra.job.chdir=true moved us
    try:
        rc = validate(cfg)
    except ConfigError as e:  # (the preflight has checked it; a sweeper of another kind may not have)
        _invalid(e.problems)
    logging.getLogger().setLevel(rc.log_level)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    from controller.session import run_session

    if rc.recovery.resume.value == "auto":
        from controller.recovery import resume_state

        state = resume_state(run_dir)
        if state == "complete":
            print(f"lockstep: the run in {run_dir} is complete (summary.json); nothing to resume", file=sys.stderr)
            return {}
        if state == "unfinished":  # recovery.resume=auto: e.g. the chart's Job restarted its controller pod
            print(f"lockstep: resuming the unfinished run in {run_dir} (recovery.resume=auto)", file=sys.stderr)
            from controller.recovery import load_run_config

            return run_session(load_run_config(run_dir), run_dir, resume=True).summary
    from controller.server import ListenError

    try:
        result = run_session(rc, run_dir)
    except ListenError as e:  # the config is valid; this host cannot serve it (docs/configuration.md)
        print(f"lockstep: {e}", file=sys.stderr)
        sys.exit(1)
    return result.summary


def _resume(args: list[str]) -> int:
    """``lockstep resume RUN_DIR``: replay the run of RUN_DIR/config.yaml and append to its outputs."""
    from controller.config import ConfigError
    from controller.recovery import NotResumable, load_run_config, resume_state

    if len(args) != 1 or args[0].startswith("-"):
        print("usage: lockstep resume RUN_DIR   (the run directory of a run whose controller died)",
              file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    run_dir = Path(args[0])
    state = resume_state(run_dir)
    if state == "empty":
        print(f"lockstep resume: {run_dir} holds no run to resume (a run writes config.yaml and plan.json "
              "there when it starts)", file=sys.stderr)
        return 2
    if state == "complete":
        print(f"lockstep resume: the run in {run_dir} is complete (summary.json); nothing to resume", file=sys.stderr)
        return 0
    try:
        rc = load_run_config(run_dir)
    except NotResumable as e:
        print(f"lockstep resume: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        _invalid([f"{run_dir / 'config.yaml'}: {p}" for p in e.problems])
    _log_to(run_dir / "lockstep.log", rc.log_level)
    from controller.session import run_session

    run_session(rc, run_dir, resume=True)
    return 0


def _log_to(path: Path, level: str) -> None:
    """What Hydra's job logging does for ``lockstep run``: the run's log file (appended to) and stderr."""
    fmt = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    root = logging.getLogger()
    for h in (logging.StreamHandler(), logging.FileHandler(path, mode="a")):
        h.setFormatter(fmt)
        root.addHandler(h)
    root.setLevel(level)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
