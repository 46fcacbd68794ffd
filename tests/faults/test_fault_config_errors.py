"""A bad ``faults:`` entry gets one sentence naming the key, the value and what is accepted; the CLI exits 2."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.config import ConfigError, load
from tests.helpers import FAST

ROOT = Path(__file__).resolve().parents[2]
PS = ["strategy=ps_async", "workers=4"]


@pytest.mark.parametrize("overrides, sentence", [
    (["faults=[{kind:crash,wrkers:[w1]}]"],
     "faults[0].wrkers is not a key of faults[0]; did you mean workers? (accepted: kind, at, until, workers, "
     "fraction, groups, probability, factor, mode, std)."),
    (["faults=[{kind:boom}]"],
     "faults[0].kind=boom is not valid; accepted: crash | partition | loss | duplicate | slow_link | straggler | "
     "byzantine."),
    (["faults=[{workers:[w1]}]"],
     "faults[0].kind is not set (??? in the config); set it, e.g. on the command line: faults[0].kind=<value>."),
    (["faults=[{kind:loss},{kind:crash,workers:[w9]}]"],
     "faults[1].workers=['w9'] is not valid; accepted: a non-empty list of this run's vworkers (w0, w1, w2, w3, "
     "ps0)."),
    (["faults=[{kind:loss,at:2s,until:1s}]"],
     "faults[0].until='1s' is not valid; accepted: null (never) or a time after faults[0].at ('2s')."),
    (["faults=[{kind:loss,at:-1}]"],
     "faults[0].at=-1 is not valid; accepted: a duration >= 0 (seconds, or a string like 1ms, 250us, 2s)."),
    (["faults=[{kind:loss,probability:2}]"],
     "faults[0].probability=2.0 is not valid; accepted: a number >= 0 and <= 1."),
    (["faults=[{kind:crash,workers:[w1],fraction:0.5}]"],
     "faults[0] sets both workers and fraction; accepted: one of them."),
    (["faults=[{kind:straggler}]"],
     "faults[0] (kind straggler) names no vworkers; accepted: faults[0].workers=[w1, ...] or "
     "faults[0].fraction=0.1 (a keyed share of the training workers)."),
    (["faults=[{kind:crash,workers:[ps0]}]"],
     "faults[0].workers=['ps0'] is not valid; accepted: training workers (w0, w1, w2, w3, ...), not a server and "
     "not ps0, which holds the result model (docs/faults.md)."),
    (["faults=[{kind:partition,groups:[[w0,w1],[w1,w2]]}]"],
     "faults[0].groups=[['w0', 'w1'], ['w1', 'w2']] is not valid; accepted: two or more non-empty, disjoint lists "
     "of this run's vworkers (w0, w1, w2, w3, ps0)."),
    (["faults=[{kind:slow_link,workers:[w1],factor:2}]"],
     "faults[0].factor=2.0 is not valid; accepted: the share of the NIC rate left, in (0, 1) for slow_link (1 "
     "changes nothing), e.g. factor: 0.1."),
    # factor's default, 1, left the NIC (the calls) as they were: a fault that did nothing, accepted silently
    (["faults=[{kind:slow_link,workers:[w1]}]"],
     "faults[0].factor=1.0 is not valid; accepted: the share of the NIC rate left, in (0, 1) for slow_link (1 "
     "changes nothing), e.g. factor: 0.1."),
    (["faults=[{kind:straggler,workers:[w1],factor:1}]"],
     "faults[0].factor=1.0 is not valid; accepted: a slowdown > 1 for straggler (1 changes nothing), e.g. factor: 4."),
    (["network=tcp", "faults=[{kind:slow_link,workers:[w1],factor:0.5}]"],
     "faults[0] (kind slow_link) is not supported with network.model=tcp or a network.topology other than star; "
     "accepted: network.model=ideal with network.topology=star, or a straggler, loss or partition fault."),
    (["compute.layerwise=true", "faults=[{kind:crash,workers:[w1]}]"],
     "faults[0] (kind crash) is not supported with compute.layerwise=true (a restarted worker rejoins with "
     "whole-model messages); accepted: compute.layerwise=false."),
    (["faults=[{kind:straggler,workers:[w1],factor:0.5}]"],
     "faults[0].factor=0.5 is not valid; accepted: a slowdown > 1 for straggler (1 changes nothing), e.g. "
     "factor: 4."),
    (["faults=[{kind:byzantine,workers:[w1],mode:noise}]"],
     "faults[0].std=0.0 is not valid; accepted: a standard deviation > 0 for byzantine mode noise."),
    (["strategy=ring_allreduce", "faults=[{kind:crash,fraction:1.0}]"],
     "faults[0].fraction=1.0 is not valid; accepted: a share of at most 3 of the 4 training workers (never the "
     "result vworker w0)."),
    (["strategy=fedavg", "faults=[{kind:crash,workers:[c1]}]"],
     "faults[0] crashes clients of fedavg, whose server would wait for ever for their updates; set "
     "strategy.round_timeout (e.g. strategy.round_timeout=10s)."),
    # keys the kind does not read, set anyway: each was ignored (a crash with probability 0 crashed)
    (["faults=[{kind:crash,workers:[w1],probability:0.0,at:10ms}]"],
     "faults[0].probability=0.0 is not valid; accepted: 1.0 for kind crash, which reads at, until, workers, fraction "
     "(docs/faults.md)."),
    (["faults=[{kind:loss,groups:[[w0],[w1]]}]"],
     "faults[0].groups=[['w0'], ['w1']] is not valid; accepted: null for kind loss, which reads at, until, workers, "
     "fraction, probability (docs/faults.md)."),
    (["faults=[{kind:byzantine,workers:[w1],factor:3}]"],
     "faults[0].factor=3.0 is not valid; accepted: 1.0 for kind byzantine, which reads at, until, workers, fraction, "
     "mode (docs/faults.md)."),
    (["faults=[{kind:partition,workers:[w1],groups:[[w0],[w1]]}]"],
     "faults[0].workers=['w1'] is not valid; accepted: null for kind partition, which reads at, until, groups "
     "(docs/faults.md)."),
    # a scale by 1 (factor's default) left the gradients as they were: a byzantine fault that corrupted nothing
    (["faults=[{kind:byzantine,workers:[w2],mode:scale}]"],
     "faults[0].factor=1.0 is not valid; accepted: a multiplier other than 1 for byzantine mode scale (1 changes "
     "nothing), e.g. factor: -4."),
    (["faults=[{kind:byzantine,workers:[w2],mode:scale,factor:1}]"],
     "faults[0].factor=1.0 is not valid; accepted: a multiplier other than 1 for byzantine mode scale (1 changes "
     "nothing), e.g. factor: -4."),
    # a mapping where a list of them goes: it was told the key's meaning ("injected faults, each keyed ...")
    (["faults={kind:crash}"],
     "faults={kind:crash} is not valid; accepted: a list of mappings, e.g. [{kind: crash, workers: [w1], at: 1s}] "
     "([] = none; docs/faults.md)."),
    (["faults=[{kind:crash,workers:w1}]"],  # with workers=4 on the command line: that override was blamed
     "faults[0].workers=w1 is not valid; accepted: a list of strings or null."),
])
def test_a_bad_fault_is_one_sentence_naming_key_value_and_what_is_accepted(overrides, sentence):
    with pytest.raises(ConfigError) as e:
        load(FAST + PS + overrides, check_data=False)
    assert e.value.problems == [sentence]


def test_the_cli_exits_2_on_a_bad_fault_with_one_sentence_and_no_traceback(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "controller.cli", "run", "launcher=inprocess", "workers=4",
                        "faults=[{kind:partition,at:1s,until:1s,groups:[[w0],[w1]]}]", f"hydra.run.dir={out}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=180, env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    assert p.returncode == 2, p.stderr
    assert "faults[0].until='1s' is not valid; accepted: null (never) or a time after faults[0].at ('1s')." in p.stderr
    assert "Traceback" not in p.stderr
    assert not out.exists()
