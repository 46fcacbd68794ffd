"""config_hash names the experiment (summary.json, lockstep_run_info, the run id's suffix): settings that change
neither what a run computes nor what it writes leave it as it is; anything else changes it."""
from __future__ import annotations

from controller.config import load
from controller.config.validate import config_hash

BASE = ["model=mlp", "compute=constant", "network=ideal"]


def _hash(*overrides: str) -> str:
    return config_hash(load([*BASE, *overrides], check_data=False).raw)


def test_the_progress_bar_log_level_outputs_and_recovery_leave_the_hash_as_it_is():
    same = _hash()
    assert _hash("progress=false") == same  # it differed: progress=false gave the experiment another hash
    assert _hash("log_level=DEBUG") == same
    assert _hash("recovery.checkpoint_every_s=5", "outputs.summary_every_s=1") == same


def test_what_a_run_computes_changes_the_hash():
    same = _hash()
    assert len({same, _hash("seed=2"), _hash("lr=0.05"), _hash("network.latency=1ms"), _hash("workers=3")}) == 5
