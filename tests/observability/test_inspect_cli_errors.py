"""`lockstep inspect` of real runs where the user asks for what it cannot give: a --write-model path it cannot
write, a time after the run's end, a model of a strategy that keeps no snapshots. Each is one sentence (or a
note) on stderr, exit status 2 where it is refused, never a traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from . import runs

pytestmark = pytest.mark.slow

UPDATES = 20


@pytest.fixture(scope="module")
def ps_run(tmp_path_factory) -> Path:
    return runs.run(tmp_path_factory.mktemp("ps_async"), "strategy=ps_async", "workers=3",
                    f"stop.updates={UPDATES}", "eval.every=0", "statelog.snapshot_every=5")


@pytest.fixture(scope="module")
def ring_run(tmp_path_factory) -> Path:
    return runs.run(tmp_path_factory.mktemp("ring"), "strategy=ring_allreduce", "workers=3",
                    f"stop.updates={UPDATES}", "eval.every=0")


def _inspect(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.cli", "inspect", str(run_dir), *args],
                          cwd=runs.ROOT, capture_output=True, text=True, timeout=60)


def _end(run_dir: Path) -> int:
    return json.loads((run_dir / "summary.json").read_text())["virtual_time_ns"]


def test_write_model_into_a_missing_directory_is_one_sentence(ps_run, tmp_path):
    out = tmp_path / "nodir" / "m.pt"
    p = _inspect(ps_run, "--at", "0.2s", "--write-model", str(out))
    assert p.returncode == 2 and p.stdout == "" and p.stderr == (
        f"lockstep inspect: --write-model {str(out)!r} cannot be written: its directory {out.parent} does not "
        "exist; accepted: a file path in an existing directory you can write to\n")
    assert not out.parent.exists()


def test_write_model_under_a_file_is_one_sentence(ps_run, tmp_path):
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "m.pt"
    p = _inspect(ps_run, "--at", "0.2s", "--write-model", str(out))
    assert p.returncode == 2 and p.stdout == "" and p.stderr == (
        f"lockstep inspect: --write-model {str(out)!r} cannot be written: {out.parent} is not a directory; "
        "accepted: a file path in an existing directory you can write to\n")
    assert (tmp_path / "afile").read_text() == ""


def test_write_model_onto_a_directory_is_one_sentence(ps_run, tmp_path):
    p = _inspect(ps_run, "--at", "0.2s", "--write-model", str(tmp_path))
    assert p.returncode == 2 and p.stdout == "" and p.stderr == (
        f"lockstep inspect: --write-model {str(tmp_path)!r} cannot be written: it is a directory; "
        "accepted: a file path in an existing directory you can write to\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("which", ["ps_run", "ring_run"])
def test_a_time_after_the_end_gives_the_states_at_the_end(which, request):
    run_dir = request.getfixturevalue(which)
    end = _end(run_dir)
    late, at_end = _inspect(run_dir, "--at", "1000s"), _inspect(run_dir, "--at", f"{end}ns")
    assert late.returncode == 0 and at_end.returncode == 0, late.stderr + at_end.stderr
    # the table is the one at the end, its header included (the time its states are of)
    assert late.stdout == at_end.stdout
    assert late.stdout.splitlines()[0] == f"virtual time {end / 1e9:.9f} s ({end} ns)"
    assert late.stderr == (f"lockstep inspect: note: T is after the run's end ({end / 1e9:.9f} s): the states "
                           "are those at its end\n")
    assert at_end.stderr == ""
    late_json = json.loads(_inspect(run_dir, "--at", "1000s", "--json").stdout)
    assert late_json == json.loads(_inspect(run_dir, "--at", f"{end}ns", "--json").stdout)


def test_write_model_of_a_strategy_without_a_parameter_server_gives_advice_the_run_accepts(ring_run, tmp_path):
    out = tmp_path / "m.pt"
    p = _inspect(ring_run, "--at", "0.2s", "--write-model", str(out))
    assert p.returncode == 2 and p.stdout == "" and p.stderr == (
        "lockstep inspect: --write-model: no parameter snapshot of w0 at or before 200000000 ns: strategy "
        "ring_allreduce has no parameter server, and only a parameter server's versions are kept as snapshots "
        "(statelog.snapshot_every, accepted with ps_sync, ps_async, ssp), so its runs keep none; "
        f"{ring_run / 'params.pt'} holds its final model (the parameters as one flat tensor)\n")
    assert not out.exists()
    # the advice the message does not give: statelog.snapshot_every is refused with this strategy
    refused = subprocess.run(runs.command(tmp_path / "again", "strategy=ring_allreduce", "workers=3",
                                          "stop.updates=2", "statelog.snapshot_every=5"),
                             cwd=runs.ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "statelog.snapshot_every" in refused.stdout + refused.stderr
