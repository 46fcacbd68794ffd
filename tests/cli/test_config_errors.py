"""Bad configs give one clear sentence naming the key and what is accepted; the CLI exits 2, no traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.config import ConfigError, validate
from tests.helpers import compose_cfg

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("override, expected", [
    ("strategy._target_=nowhere.Nothing", r"strategy=.*cannot be loaded.*accepted: sgd \| ps_sync \| ps_async"),
    ("workers=0", r"workers=0 is not valid; accepted: an integer >= 1"),
    ("network.latency=-1ms", r"network.latency='-1ms' is not valid; accepted: a duration >= 0"),
    ("network.bandwidth=0", r"network.bandwidth=0 is not valid; accepted: a bandwidth > 0"),
    ("network.bandwidth=fast", r"network.bandwidth='fast' is not valid; accepted: bytes/s"),
    ("network.discipline=lifo", r"network.discipline='lifo' is not valid; accepted: fifo \| fair \| unlimited"),
    ("batch_size=5000", r"batch_size=5000 is larger than the shard of vworker w0 \(938 samples"),
    ("data.root=/nonexistent", r"data.root='/nonexistent'.*/nonexistent"),
    ("compute.model=guess", r"compute.model='guess' is not valid; accepted: profiled \| measured"),
    ("lr=-0.1", r"lr=-0.1 is not valid; accepted: a number > 0"),
    ("stop.updates=null", r"stop.updates and stop.virtual_time are both null"),
    ("model._target_=torch.nn.NotAModule", r"model._target_='torch.nn.NotAModule' is not usable"),
    ("agents=500", r"agents=500 is not valid; accepted: at most the number of vworkers \(65\)"),
    ("compute.batch=fast", r"compute.batch='fast' is not valid; accepted: off \| loop \| vmap \| auto"),
    ("compute.max_batch=0", r"compute.max_batch=0 is not valid; accepted: an integer >= 1"),
    ("compute.overlap=sometimes", r"compute.overlap='sometimes' is not valid; accepted: auto \(on with at least 2"),
    ("controller.windows=ring", r"controller.windows='ring' is not valid; accepted: direct \| hub"),
    ("workers=70000", r"workers=70000 is not valid; accepted: at most the 60000 training samples, or set "
                      r"data.per_client"),
    ("data.per_client=32", None),  # valid with data.partition=iid: no error
])
def test_bad_value_names_key_and_accepted_values(override, expected):
    if expected is None:
        validate(compose_cfg([override]))
        return
    with pytest.raises(ConfigError, match=expected):
        validate(compose_cfg([override]))


@pytest.mark.parametrize("overrides, expected", [
    (["data.partition=dirichlet", "data.per_client=8"], r"data.per_client=8 is not valid; accepted: null unless "
                                                        r"data.partition=iid"),
    (["data.per_client=70000"], r"data.per_client=70000 is not valid; accepted: at most the 60000 training"),
    (["data.per_client=8", "batch_size=16"], r"batch_size=16 is larger than the shard of vworker w0 \(8 samples"),
])
def test_per_client_shards_are_checked(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        validate(compose_cfg(overrides))


def test_constant_compute_without_a_duration_names_the_key():
    with pytest.raises(ConfigError, match=r"compute.gradient is not set; compute=constant needs"):
        validate(compose_cfg(["compute=constant", "compute.gradient=null"]))


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as e:
        validate(compose_cfg(["workers=0", "lr=0", "network.discipline=x"]))
    assert len(e.value.problems) == 3


def test_the_default_config_is_valid():
    rc = validate(compose_cfg([]))
    assert (rc.workers, rc.strategy_name, rc.model["_target_"]) == (64, "ps_async", "agents.workloads.models.ThesisCNN")


def test_cli_exits_2_with_one_sentence_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "controller.cli", "run", "workers=-3", f"hydra.run.dir={out}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    assert p.returncode == 2, p.stderr
    assert "workers=-3 is not valid; accepted: an integer >= 1." in p.stderr
    assert "Traceback" not in p.stderr
    assert not (out / "metrics.csv").exists()
