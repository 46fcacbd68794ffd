"""Exact delivery times under contention for each discipline (DESIGN §4.1)."""
from __future__ import annotations

import pytest

from agents.common.units import UnitError, parse_duration, parse_rate, parse_size
from agents.sim.worker import Worker
from tests.engine.workers import Sink

MS = 1_000_000


class Sender(Worker):
    def __init__(self, name, vid, env, to=(), nbytes=1000):
        super().__init__(name, vid, env)
        self.to, self.nbytes, self.handles = to, nbytes, []

    async def run(self):
        for dst in self.to:
            self.handles.append(self.send(dst, None, nbytes=self.nbytes))
        for h in self.handles:
            await h
        self.left = [h.done_at for h in self.handles]


@pytest.mark.parametrize("disc, expected", [
    ("fifo", {"a": 2 * MS, "c": 3 * MS}),
    ("fair", {"a": 3 * MS, "c": 3 * MS}),
    ("unlimited", {"a": 2 * MS, "c": 2 * MS}),
])
def test_two_senders_to_one_receiver(build_kernel, disc, expected):
    k, _, o = build_kernel({"a": (Sender, {"to": ["b"]}), "b": (Sink, {"expect": 2}), "c": (Sender, {"to": ["b"]})},
                           latency_ns=MS, bw=1e6, egress=disc, ingress=disc)
    k.run_until()
    assert o["b"].got == expected
    assert o["a"].left == [MS] and o["c"].left == [MS]


@pytest.mark.parametrize("disc, delivered, left", [
    ("fifo", {"b": 2 * MS, "c": 3 * MS}, [MS, 2 * MS]),
    ("fair", {"b": 3 * MS, "c": 3 * MS}, [2 * MS, 2 * MS]),
    ("unlimited", {"b": 2 * MS, "c": 2 * MS}, [MS, MS]),
])
def test_one_sender_to_two_receivers(build_kernel, disc, delivered, left):
    k, _, o = build_kernel({"a": (Sender, {"to": ["b", "c"]}), "b": (Sink, {}), "c": (Sink, {})},
                           latency_ns=MS, bw=1e6, egress=disc, ingress=disc)
    k.run_until()
    assert {"b": o["b"].got["a"], "c": o["c"].got["a"]} == delivered
    assert o["a"].left == left


def test_fair_ingress_caps_each_flow_at_its_senders_rate(build_kernel):
    # b receives at 3 MB/s; a sends at 1 MB/s, c at 4 MB/s. Water-filling: a 1 MB/s, c 2 MB/s;
    # a done at 1 ms (c has 2000 B left), then c alone at 3 MB/s: 2000/3e6 s = 666 667 ns more.
    k, _, o = build_kernel({"a": (Sender, {"to": ["b"], "nbytes": 1000}), "b": (Sink, {"expect": 2}),
                            "c": (Sender, {"to": ["b"], "nbytes": 4000})},
                           bw=[1e6, 3e6, 4e6], egress="fair", ingress="fair")
    k.run_until()
    assert o["b"].got == {"a": MS, "c": 1_666_667}


def test_mixed_disciplines_fair_egress_fifo_ingress(build_kernel):
    # a sends 1000 B to b and c over a shared egress: both leave at 2 ms; b's and c's ingress are idle,
    # so each is delivered at e1 + L.
    k, _, o = build_kernel({"a": (Sender, {"to": ["b", "c"]}), "b": (Sink, {}), "c": (Sink, {})},
                           latency_ns=MS, bw=1e6, egress="fair", ingress="fifo")
    k.run_until()
    assert (o["b"].got["a"], o["c"].got["a"]) == (3 * MS, 3 * MS)


def test_uncontended_message_takes_latency_plus_size_over_slowest_nic(build_kernel):
    for disc in ("fifo", "fair", "unlimited"):
        k, _, o = build_kernel({"a": (Sender, {"to": ["b"], "nbytes": 5000}), "b": (Sink, {})},
                               latency_ns=123, bw=[1e6, 1e6], bw_in=[1e6, 5e5], egress=disc, ingress=disc)
        k.run_until()
        assert o["b"].got["a"] == 123 + 10 * MS, disc


def test_payload_bytes_default_to_tensor_bytes(build_kernel):
    import torch

    class T(Worker):
        async def run(self):
            self.send("b", {"g": torch.zeros(250), "meta": 3}).done_at

    k, env, _ = build_kernel({"a": (T, {}), "b": (Sink, {})}, bw=1e6)
    k.run_until()
    assert env.stats.bytes_local == 1000


@pytest.mark.parametrize("text, seconds", [("1ms", 1e-3), ("250us", 250e-6), (2, 2.0), ("1.5s", 1.5), ("3ns", 3e-9)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, bps", [("10Gbit/s", 1.25e9), ("100MB/s", 1e8), ("1Gbps", 1.25e8),
                                       ("50MiB/s", 50 * 2**20), (1e6, 1e6)])
def test_rates(text, bps):
    assert parse_rate(text) == pytest.approx(bps)


def test_sizes_and_bad_units():
    assert parse_size("4KiB") == 4096
    with pytest.raises(UnitError, match="network.bandwidth.*accepted"):
        parse_rate("10 parsecs", "network.bandwidth")
    with pytest.raises(UnitError, match="missing /s"):
        parse_rate("10GB")
    with pytest.raises(UnitError, match="unknown time unit"):
        parse_duration("3 fortnights")
