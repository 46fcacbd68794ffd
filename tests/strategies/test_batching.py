"""Deferred, batched compute (DESIGN §4.2, agents/sim/executor.py) through whole runs of every strategy.

``compute.batch=loop`` defers every compute call and runs it later, one call per task: outputs must be
byte-identical to eager execution (``off``), in-process and over agents, whatever the placement.
``vmap`` runs same-shaped gradients as one ``torch.func.vmap`` call: parameters within 1e-5 of ``off``,
and a rerun identical to the bit. ``auto`` probes at start-up and records its figures in summary.json.
"""
from __future__ import annotations

import json

import pytest
import torch

from tests.distributed.conftest import assert_same_outputs
from tests.distributed.conftest import run as run_dist

STRATEGIES = ["ps_sync", "ps_async", "ssp", "ring_allreduce", "hierarchical_allreduce", "gossip", "local_sgd",
              "fedavg", "fedasync", "sgd"]
# heterogeneous speeds make the asynchronous strategies interleave; every worker holds data
COMMON = ["workers=4", "stop.updates=10", "eval.every=5", "eval.samples=300", "network.latency=1ms",
          "compute.speed=[1,1.5,2,3]", "strategy.local_steps=2"]


def _common(strategy: str) -> list[str]:
    extra = ["strategy.group_size=2"] if strategy == "hierarchical_allreduce" else []
    if strategy in ("sgd",):
        return ["workers=1", "stop.updates=10", "eval.every=5", "eval.samples=300"]
    if strategy not in ("local_sgd", "fedavg", "fedasync"):
        return [o for o in COMMON if not o.startswith("strategy.local_steps")] + extra
    return COMMON + extra


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_loop_gives_byte_identical_outputs_to_off_in_process_and_over_two_agents(tmp_path, strategy):
    base = [f"strategy={strategy}", *_common(strategy)]
    off = run_dist(tmp_path / "off", base + ["compute.batch=off"])
    loop = run_dist(tmp_path / "loop", base + ["compute.batch=loop"])
    assert off.summary["updates"] == 10
    assert loop.summary["compute_batch"]["deferred"] and loop.summary["compute_batch"]["tasks"] > 0
    assert loop.summary["compute_batch"]["eager_identical"] is True
    assert_same_outputs(tmp_path / "off", tmp_path / "loop")
    if strategy == "sgd":
        return  # one vworker: nothing to place
    # two agents (in-process), with the work split each way: still the same bytes, for both modes
    for mode in ("off", "loop"):
        for placement in ("round_robin", "block"):
            d = tmp_path / f"a2-{mode}-{placement}"
            r = run_dist(d, base + [f"compute.batch={mode}", "agents=2", f"placement={placement}"])
            assert r.summary["messages_remote"] > 0
            assert_same_outputs(tmp_path / "off", d)


@pytest.mark.parametrize("strategy", ["ps_async", "fedavg"])
def test_loop_over_two_agent_processes_with_overlap_matches_off_in_one_process(tmp_path, strategy):
    base = [f"strategy={strategy}", *_common(strategy)]
    run_dist(tmp_path / "off", base + ["compute.batch=off"])
    r = run_dist(tmp_path / "local", base + ["compute.batch=loop", "compute.overlap=true", "agents=2"], local=True)
    assert r.summary["compute_batch"]["tasks"] > 0 and r.summary["messages_remote"] > 0
    assert_same_outputs(tmp_path / "off", tmp_path / "local")


def test_overlap_auto_runs_a_background_thread_only_in_agent_processes_beside_others(tmp_path):
    """In one process the vworkers' own thread never waits, so a background thread only contends for the GIL
    (measured +15 % wall on the MLP, no gain on the CNN): overlap=auto leaves it off there. An agent
    process waits for its peers' windows, and there (with two usable CPUs) the thread computes meanwhile."""
    from agents.sim.env import usable_cpus

    base = ["strategy=ps_async", "workers=4", "stop.updates=6", "eval.every=0", "compute.batch=loop"]
    one = run_dist(tmp_path / "one", base)
    two_inprocess = run_dist(tmp_path / "two_inprocess", base + ["agents=2"])
    two_local = run_dist(tmp_path / "two_local", base + ["agents=2"], local=True)
    forced = run_dist(tmp_path / "forced", base + ["compute.overlap=true"])
    assert one.summary["compute_batch"]["overlap"] is False
    assert two_inprocess.summary["compute_batch"]["overlap"] is False
    assert two_local.summary["compute_batch"]["overlap"] is (usable_cpus() >= 2)
    assert forced.summary["compute_batch"]["overlap"] is True
    assert_same_outputs(tmp_path / "one", tmp_path / "two_local")  # the thread never changes what is computed


VMAP = ["workers=8", "stop.updates=100", "eval.every=0", "network.latency=100us", "batch_size=8"]


@pytest.mark.parametrize("strategy", ["ps_sync", "ps_async", "fedavg"])
def test_vmap_stays_within_1e_5_of_off_after_100_updates_and_reruns_identically(tmp_path, strategy):
    extra = ["strategy.local_steps=1", "strategy.fraction=1.0"] if strategy == "fedavg" else []
    base = [f"strategy={strategy}", *VMAP, *extra]
    off = run_dist(tmp_path / "off", base + ["compute.batch=off"])
    vm = run_dist(tmp_path / "vmap", base + ["compute.batch=vmap"])
    again = run_dist(tmp_path / "again", base + ["compute.batch=vmap"])
    cb = vm.summary["compute_batch"]
    assert cb["vmap_batches"] > 0 and cb["largest_batch"] > 1, "same-shaped gradients should have run together"
    assert cb["eager_identical"] is False  # vmap's floats differ in the last bits, and the summary says so
    assert off.summary["updates"] == vm.summary["updates"] == 100
    rel = float((vm.params - off.params).norm() / off.params.norm())
    assert rel <= 1e-5, rel  # (0 on some CPUs: this VM's Xeon gave the loop's bits on 2026-12-02, and CI failed
    # on `0 < rel`; what the issue asks is the bound)
    assert off.summary["virtual_time_ns"] == vm.summary["virtual_time_ns"]  # durations come from the model
    assert_same_outputs(tmp_path / "vmap", tmp_path / "again")


def test_vmap_over_two_agent_processes_with_overlap_matches_vmap_in_one_process(tmp_path):
    """The same rows from another process, another batching and the background thread (docs/batching.md,
    "Placement"): each agent checks its rule before its first window, and summary.json says so."""
    base = ["strategy=ps_async", *VMAP, "compute.speed=[1,1.5,2,3,1,1,2,1]", "compute.batch=vmap"]
    one = run_dist(tmp_path / "one", base)
    r = run_dist(tmp_path / "local", base + ["compute.overlap=true", "agents=2"], local=True)
    cb = r.summary["compute_batch"]
    assert cb["overlap"] is True and cb["placement_independent"] is True and r.summary["messages_remote"] > 0
    assert cb["vmap_batches"] > one.summary["compute_batch"]["vmap_batches"]  # the batches split by agent
    assert_same_outputs(tmp_path / "one", tmp_path / "local")


def test_auto_records_its_probe_and_choice_in_the_summary(tmp_path):
    db = tmp_path / "profiles.json"
    base = ["strategy=ps_sync", *VMAP, "stop.updates=3", f"compute.db={db}", "compute.max_batch=8"]
    r = run_dist(tmp_path / "auto", base + ["compute.batch=auto"])
    cb = r.summary["compute_batch"]
    (probes,) = cb["probes"]
    (sig, probe), = probes.items()
    assert sig.startswith("gradient|") and "MLP" in sig
    assert sorted(probe["figures"], key=int) == ["2", "4", "8"]  # batch sizes up to max_batch and the workers
    for fig in probe["figures"].values():
        assert fig["loop_s"] > 0 and fig["vmap_s"] > 0
    # the choice follows the figures: vmap from the smallest size whose batches (and all larger) win by 10 %
    wins = [int(n) for n, f in probe["figures"].items() if f["vmap_s"] <= 0.9 * f["loop_s"]]
    expected = None
    for n in sorted(map(int, probe["figures"]), reverse=True):
        if n not in wins:
            break
        expected = n
    assert probe["vmap_from"] == expected
    assert cb["eager_identical"] == (cb["vmap_tasks"] == 0)
    assert cb["placement_independent"] is False  # its choice follows the batch sizes an agent can form
    # the figures are kept in the profile database: a rerun reads them and chooses alike
    stored = json.loads(db.read_text())
    assert any(k.startswith("batchprobe|vmap|8|") for dev in stored.values() for k in dev)
    r2 = run_dist(tmp_path / "again", base + ["compute.batch=auto"])
    assert r2.summary["compute_batch"]["probes"] == cb["probes"]
    assert_same_outputs(tmp_path / "auto", tmp_path / "again")


def test_summary_reports_peak_memory(tmp_path):
    r = run_dist(tmp_path, ["strategy=ps_async", "workers=2", "stop.updates=2"])
    mem = r.summary["peak_memory"]
    assert mem["max_rss_bytes"] >= mem["controller_rss_bytes"] > 50 * 2**20  # torch alone is larger
    assert len(mem["agents_rss_bytes"]) == 1


def test_the_default_defers_as_a_loop_and_off_runs_eagerly(tmp_path):
    r = run_dist(tmp_path / "default", ["strategy=ps_async", "workers=2", "stop.updates=2"])
    cb = r.summary["compute_batch"]
    assert (cb["mode"], cb["deferred"], cb["eager_identical"], cb["vmap_tasks"]) == ("loop", True, True, 0)
    off = run_dist(tmp_path / "off", ["strategy=ps_async", "workers=2", "stop.updates=2", "compute.batch=off"])
    assert off.summary["compute_batch"] == {"mode": "off", "overlap": False, "deferred": False,
                                            "eager_identical": True, "placement_independent": True}
    assert torch.equal(r.params, off.params)


@pytest.mark.parametrize("strategy", ["ps_sync", "ps_async", "local_sgd", "fedavg"])
def test_vmap_outputs_do_not_depend_on_the_number_of_agents_or_the_placement(tmp_path, strategy):
    """On the CPU each row of the vmap rule is the same whatever else is in its batch (measured for the MLP,
    the CNN and the ResNet at 1-64 rows, 1 and 2 threads), and a batch of one runs the rule too, as two
    copies: so the batches that form per agent never change a float (docs/batching.md). Before, a gradient
    whose batch split between two agents into batches of one ran as a plain call: other last bits."""
    extra = {"ps_sync": ["model=cnn", "stop.updates=20"],
             "local_sgd": ["model=cnn", "strategy.local_steps=2", "stop.updates=10"],
             "fedavg": ["strategy.local_steps=1", "strategy.fraction=0.5", "stop.updates=10"]}.get(strategy, [])
    base = [f"strategy={strategy}", *VMAP, "compute.speed=[1,1.5,2,3,1,1,2,1]", "compute.batch=vmap", *extra]
    one = run_dist(tmp_path / "one", base)
    cb = one.summary["compute_batch"]
    assert cb["vmap_tasks"] > cb["vmap_batches"] > 0  # gradients by the rule, some in batches of several
    assert cb["placement_independent"] is True
    for placement in ("round_robin", "block"):
        d = tmp_path / f"a2-{placement}"
        r = run_dist(d, base + ["agents=2", f"placement={placement}"])
        assert r.summary["messages_remote"] > 0
        assert r.summary["compute_batch"]["vmap_batches"] > cb["vmap_batches"]  # the batches split by agent
        assert_same_outputs(tmp_path / "one", d)
