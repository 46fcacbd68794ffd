"""Keys the chosen compute model, network topology or strategy never reads are refused in one sentence each
(docs/configuration.md, "How a config is checked"), not ignored; the keys they do read stay valid."""
from __future__ import annotations

import json

import pytest

from controller.config import ConfigError, load
from tests.helpers import run

CONSTANTS = ("is read by compute=constant, and by compute=distribution for a kind not in compute.kinds; "
             "it changed nothing).")
SHARE = ("whose flows share every link of their routes, NICs included, max-min fairly (the disciplines are read "
         "with network.topology=star, and the egress by a parameter server with compute.layerwise=true; it changed "
         "nothing).")


@pytest.mark.parametrize("overrides, expected", [
    # the constant durations: compute=constant's, and distribution's for the kinds it does not draw
    (["compute=profiled", "compute.gradient=0.5"],
     "compute.gradient=0.5 is not valid; accepted: null with compute=profiled (compute.gradient " + CONSTANTS),
    (["compute=measured", "compute.update=1ms"],
     "compute.update=1ms is not valid; accepted: null with compute=measured (compute.update " + CONSTANTS),
    (["compute=analytic", "compute.aggregate=0.001"],
     "compute.aggregate=0.001 is not valid; accepted: null with compute=analytic (compute.aggregate " + CONSTANTS),
    (["compute=distribution", "compute.gradient=0.1"],
     "compute.gradient=0.1 is not valid; accepted: null with compute=distribution and compute.kinds=['gradient'], "
     "which draws gradient from compute.distribution (compute.gradient " + CONSTANTS),
    # each model's own keys
    (["compute=constant", "compute.peak_flops=1e9"],
     "compute.peak_flops=1e9 is not valid; accepted: 1000000000000.0 with compute=constant (compute.peak_flops is "
     "read by compute=analytic; it changed nothing)."),
    (["compute=profiled", "compute.distribution=normal"],
     "compute.distribution=normal is not valid; accepted: 'lognormal' with compute=profiled (compute.distribution "
     "is read by compute=distribution; it changed nothing)."),
    (["compute=analytic", "compute.params=[0.1,0.2]"],
     "compute.params=[0.1,0.2] is not valid; accepted: [0.165, 0.8632] with compute=analytic (compute.params is "
     "read by compute=distribution; it changed nothing)."),
    (["compute=measured", "compute.kinds=[update]"],
     "compute.kinds=[update] is not valid; accepted: ['gradient'] with compute=measured (compute.kinds is read by "
     "compute=distribution; it changed nothing)."),
    (["compute=constant", "compute.runs=9"],
     "compute.runs=9 is not valid; accepted: 5 with compute=constant (compute.runs is read by compute=profiled, "
     "and by compute=measured's predictions (predict=true, lockstep predict), which time the calls the profile "
     "database lacks; it changed nothing)."),
    (["compute=analytic", "compute.db=/tmp/profiles-db.json"],
     "compute.db=/tmp/profiles-db.json is not valid; accepted: null with compute=analytic and compute.batch=loop "
     "(compute.db is read by compute=profiled, by compute=measured's predictions, and by compute.batch=auto, "
     "which keeps its probe's timings there; it changed nothing)."),
    # network: the star's NIC disciplines with a topology
    (["network=ideal", "network.topology=tree", "network.discipline=fifo"],
     "network.discipline=fifo is not valid; accepted: 'fair' with network.topology=tree, " + SHARE),
    (["network=ideal", "network.topology=fat_tree", "network.ingress=unlimited"],
     "network.ingress=unlimited is not valid; accepted: null with network.topology=fat_tree, " + SHARE),
    (["network=ideal", "network.topology=fat_tree", "network.egress=fifo"],
     "network.egress=fifo is not valid; accepted: null with network.topology=fat_tree, " + SHARE),
    (["network=ideal", "network.topology={links:[[a,b,1e9]],attach:{w0:a,w1:a,ps0:b}}", "workers=2",
      "network.discipline=unlimited"],
     "network.discipline=unlimited is not valid; accepted: 'fair' with a custom network.topology, " + SHARE),
    # network: another topology's links
    (["network=ideal", "network.topology=tree", "network.links.spines=4"],
     "network.links.spines=4 is not valid; accepted: 2 with network.topology=tree, which reads network.links."
     "bandwidth, latency, edges and ends_per_edge (it changed nothing)."),
    (["network=ideal", "network.topology=fat_tree", "network.links.edges=5"],
     "network.links.edges=5 is not valid; accepted: 3 with network.topology=fat_tree, which reads network.links."
     "bandwidth, latency, hosts_per_leaf, spines and oversubscription (it changed nothing)."),
    (["network=ideal", "network.links.bandwidth=10Gbit/s"],
     "network.links.bandwidth=10Gbit/s is not valid; accepted: '1Gbit/s' with network.topology=star, which reads "
     "no network.links key (they are the tree and fat_tree presets' links; it changed nothing)."),
    (["network=ideal", "network.topology={links:[[a,b,1e9]],attach:{w0:a,w1:a,ps0:b}}", "workers=2",
      "network.links.latency=1ms"],
     "network.links.latency=1ms is not valid; accepted: '100us' with a custom network.topology, which reads no "
     "network.links key (they are the tree and fat_tree presets' links; it changed nothing)."),
    # network: the tcp transport's parameters with the ideal stations
    (["network=ideal", "network.tcp.rto_min=1ms"],
     "network.tcp.rto_min=1ms is not valid; accepted: '200ms' with network.model=ideal, which reads no network.tcp "
     "key (they are the tcp transport's; it changed nothing), or network.model=tcp."),
    (["network=tcp", "network.model=ideal", "network.tcp.delayed_ack=true"],
     "network.tcp.delayed_ack=true is not valid; accepted: False with network.model=ideal, which reads no "
     "network.tcp key (they are the tcp transport's; it changed nothing), or network.model=tcp."),
    # trace: a mode's own keys under another mode (a full trace with trace.window set kept the whole run)
    (["trace.window=[0.1,0.12]"],
     "trace.window=[0.1,0.12] is not valid; accepted: null with trace.mode=full (trace.window is read by "
     "trace.mode=window; it changed nothing)."),
    (["trace.mode=window", "trace.window=[0,1]", "trace.sample_every=3"],
     "trace.sample_every=3 is not valid; accepted: 8 with trace.mode=window (trace.sample_every is read by "
     "trace.mode=sample; it changed nothing)."),
    (["trace.mode=off", "trace.max_events=10"],
     "trace.max_events=10 is not valid; accepted: 500000 with trace.mode=off, which writes no trace (it changed "
     "nothing)."),
    # one learner
    (["strategy=sgd", "workers=4"],
     "workers=4 is not valid; accepted: 1 with strategy=sgd, which trains one learner (w0); strategy=ps_sync or "
     "another strategy trains several workers."),
])
def test_a_key_the_run_does_not_read_is_refused_in_one_sentence(overrides, expected):
    with pytest.raises(ConfigError) as e:
        load(["model=mlp", *overrides], check_data=False)
    assert e.value.problems == [expected]


@pytest.mark.parametrize("overrides", [
    ["compute=constant", "compute.gradient=0.5", "compute.update=1ms", "compute.aggregate=0"],
    ["compute=distribution", "compute.update=1ms", "compute.params=[0.1,0.2]", "compute.kinds=[gradient]"],
    ["compute=distribution", "compute.distribution=normal", "compute.params=[0.1,0.01]"],
    # the preset's own update (0.001), unread once kinds draws it, is no value the user set
    ["compute=distribution", "compute.kinds=[gradient,update]"],
    ["compute=analytic", "compute.peak_flops=1e9"],
    ["compute=profiled", "compute.runs=9", "compute.db=/tmp/profiles-db.json"],
    ["compute=measured", "compute.runs=9", "compute.db=/tmp/profiles-db.json"],  # lockstep predict times misses
    ["compute=constant", "compute.batch=auto", "compute.db=/tmp/profiles-db.json"],  # the batch probe's timings
    ["compute=profiled", "compute.gradient=null", "compute.peak_flops=1000000000000.0"],  # the defaults
    ["network=ideal", "network.topology=tree", "network.links.edges=2", "network.links.ends_per_edge=2",
     "network.links.bandwidth=125e6", "network.links.latency=1ms", "network.discipline=fair"],
    ["network=ideal", "network.topology=fat_tree", "network.links.hosts_per_leaf=2", "network.links.spines=3",
     "network.links.oversubscription=2", "network.efficiency=0.9", "network.bandwidth_in=10Gbit/s"],
    ["network=ideal", "network.discipline=fifo", "network.ingress=unlimited"],  # star: the disciplines apply
    ["network=ideal", "network.links.bandwidth=125000000", "network.links.latency=0.0001"],  # the defaults, spelt
    # a layer-wise PS paces its per-layer sends by its egress's discipline, also over a topology
    ["network=ideal", "network.topology=tree", "strategy=ps_sync", "workers=3", "compute.layerwise=true",
     "network.discipline=fifo"],
    ["network=ideal", "network.topology=tree", "strategy=ps_async", "workers=3", "compute.layerwise=true",
     "network.egress=fifo"],
    ["strategy=sgd", "workers=1"],
    ["network=tcp", "network.tcp.rto_min=1ms", "network.tcp.delayed_ack=true", "network.tcp.mtu=9000"],
    ["network=ideal", "network.tcp.rto_min=0.2", "network.tcp.host_latency=257us"],  # the defaults, spelt
    ["trace.mode=window", "trace.window=[0.1,0.2]", "trace.max_events=100"],
    ["trace.mode=sample", "trace.sample_every=3"],
    ["trace.mode=off", "trace.sample_every=8", "trace.max_events=500000"],  # the defaults
])
def test_the_keys_the_run_reads_stay_valid(overrides):
    load(["model=mlp", *overrides], check_data=False)


def test_sgd_trains_one_learner_and_its_summary_says_so(tmp_path):
    assert load(["strategy=sgd"], check_data=False).workers == 1  # conf/strategy/sgd.yaml: one learner
    assert load(["strategy=sgd", "+experiment=gossip_vs_ring"], check_data=False).workers == 1
    assert load(["strategy=ps_sync"], check_data=False).workers == 64  # (the others keep theirs)
    run(tmp_path, ["strategy=sgd", "stop.updates=2"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["strategy"], summary["workers"], summary["updates"]) == ("sgd", 1, 2)
