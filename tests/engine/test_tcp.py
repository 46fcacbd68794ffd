"""The tcp transport model, one effect at a time, with delivery times derived by hand (docs/engine.md).

Conventions of every derivation below: a full segment carries MSS = 1500 − 52 = 1448 bytes
and costs 1448 + 52 + 38 = 1538 bytes of line time; a packet of n segments costs
``payload + 90·n`` bytes; ACKs are 90 bytes. A fresh connection has cwnd = 10 segments and
the handshake's RTT sample 2L (srtt 2L, RTO = 2L + 200 ms). A packet carries at most half the
window (``tcp_cwnd_test``): a fresh connection's first 10 segments leave as two packets of 5. The NIC's token bucket starts
full (72 887 bytes), so a host's first packet leaves at once; the line then serialises
(``e = max(t, egress_free) + w/B``), the latency follows, and the receiver's switch port
serialises again in arrival order (``r = max(e + L, port_free + w/B)``). Host latency, and the hosts' share of
a round trip (``host_rtt``, ``ack_delay``), are 0 unless a test sets them.
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from agents.sim import keyed
from agents.sim import tcp as tcp_model
from agents.sim.tcp import TcpSpec, _sndbuf, goodput_fraction, wire_bytes
from agents.sim.worker import Worker
from agents.strategies.collective import GlooP2P, _GlooPair, gloo_ring_allreduce

MS = 1_000_000
SEG = 1448
TCP = TcpSpec(host_latency_ns=0, host_rtt_min_ns=0, host_rtt_max_ns=0, ack_delay_ns=0)


class Sender(Worker):
    """Sends ``plan`` = [(at_ns, dst, nbytes), ...] in order, each at its time."""

    def __init__(self, name, vid, env, plan=()):
        super().__init__(name, vid, env)
        self.plan = list(plan)

    async def run(self):
        for at, dst, nbytes in self.plan:
            if at > self.now:
                await self.sleep(at - self.now)
            self.send(dst, None, nbytes=nbytes, tag="m")


class Sink(Worker):
    def __init__(self, name, vid, env, expect=1):
        super().__init__(name, vid, env)
        self.expect, self.got = expect, []

    async def run(self):
        for _ in range(self.expect):
            m = await self.recv()
            self.got.append((m.src, m.nbytes, m.delivered_at))


def ns(nbytes: int, rate: float) -> int:
    """Line time of ``nbytes`` at ``rate`` bytes/s (the rates below make it a whole number of ns)."""
    t = nbytes * 1_000_000_000 / rate
    assert t == int(t)
    return int(t)


def test_goodput_is_payload_per_wire_byte_of_ethernet_frames():
    assert wire_bytes(TCP, 10 * SEG) == 15380 and wire_bytes(TCP, 1) == 91 and wire_bytes(TCP, 0) == 90
    assert goodput_fraction(TCP) == 1448 / 1538


def test_a_message_within_the_initial_window_takes_its_line_time_plus_latency(build_kernel):
    B = 125e6  # 1 Gbit/s
    k, _, o = build_kernel({"a": (Sender, {"plan": [(0, "b", 10 * SEG)]}), "b": (Sink, {})},
                           latency_ns=MS, bw=B, tcp=TCP)
    k.run_until()
    # one packet of 10 segments: 15380 bytes = 123 040 ns on the line, then L; the port is idle
    assert o["b"].got == [("a", 10 * SEG, ns(15380, B) + MS)] == [("a", 14480, 1_123_040)]


def test_the_eleventh_segment_waits_one_round_trip_for_the_window_to_grow(build_kernel):
    B = 125e6
    k, _, o = build_kernel({"a": (Sender, {"plan": [(0, "b", 11 * SEG)]}), "b": (Sink, {})},
                           latency_ns=MS, bw=B, tcp=TCP)
    k.run_until()
    first = ns(7690, B)                     # 10 segments leave at 0 as two packets of 5; the first
    ack_back = first + MS + ns(90, B) + MS  # reaches b at first + L; b's ACK: 90 bytes, then L; cwnd 10 -> 15
    last = ack_back + ns(1538, B) + MS      # the 11th segment: one more line time and L
    assert o["b"].got == [("a", 11 * SEG, last)] == [("a", 15928, 3_074_544)]


@pytest.mark.parametrize("idle_ms, delivered", [
    (100, 100 * MS + 1_246_080),     # idle < RTO (202 ms): cwnd stays 20, one packet of 20 segments
    (1000, 1000 * MS + 3_185_280),   # idle > RTO: cwnd halves once per RTO beyond the first, back to 10
])
def test_a_transfer_after_an_idle_gap_longer_than_the_rto_restarts_slow_start(build_kernel, idle_ms, delivered):
    B = 125e6
    plan = [(0, "b", 10 * SEG), (idle_ms * MS, "b", 20 * SEG)]
    k, _, o = build_kernel({"a": (Sender, {"plan": plan}), "b": (Sink, {"expect": 2})},
                           latency_ns=MS, bw=B, tcp=TCP)
    k.run_until()
    T = idle_ms * MS
    # the first message's two ACKs grew cwnd to 20 segments; the RTO is 2 ms + 200 ms, 51 jiffies of
    # 4 ms; restart after idle compares whole jiffies since the last data sent (at 0)
    if idle_ms < 202:
        expect = T + ns(20 * SEG + 20 * 90, B) + MS                  # 30 760 bytes at once (two packets of 10)
    else:
        # cwnd 10: two packets of 5; the first one's ACK makes it 15 with 5 in flight, so 7 segments
        # then 3 more leave at once: the last of them ends 10 segments' line time after that ACK
        first_acked = T + ns(7690, B) + MS + ns(90, B) + MS
        expect = first_acked + ns(15380, B) + MS
    assert expect == delivered
    assert o["b"].got[1] == ("a", 20 * SEG, delivered)


def test_a_restart_after_idle_sizes_its_first_packets_with_the_pacing_rate_of_the_last_ack(build_kernel):
    # Linux sets sk_pacing_rate only when it has processed an ACK (tcp_update_pacing_rate, the end of
    # tcp_cong_control); tcp_cwnd_restart cuts cwnd to 10 and leaves the rate as it was. The testbed's PS
    # (K = 4, 10 ms, 100 Mbit/s, 10 MB) shows it on its sockets: cwnd 10 with the previous transfer's
    # 7.78 MB/s until the first ACK, and every restarted window leaving as 5 + 4 segments after gloo's
    # preamble (docs/benchmarks.md, "The pacing rate of the last ACK"). At 10 ms TSO autosizing adds nothing
    # for the path (min RTT 20 ms >> 9 > 31), so a rate computed afresh from cwnd 10 and srtt 20 ms,
    # 2 x 10 x 1 448 B / 20 ms = 1.45 MB/s, 1 414 B per ms, would cut them into packets of 2.
    B, L = 12.5e6, 10 * MS
    plan = [(0, "b", 200 * SEG), (3000 * MS, "b", 10 * SEG)]
    k, env, o = build_kernel({"a": (Sender, {"plan": plan}), "b": (Sink, {"expect": 2})},
                             latency_ns=L, bw=B, tcp=TCP)
    k.run_until(3000 * MS - 1)
    snd = env.network._hosts[0].senders[1]
    assert o["b"].got[0][:2] == ("a", 200 * SEG) and snd.packets_out == 0 and snd.cwnd > 100
    rate = snd.pacing_rate()
    assert rate >> 10 >= 5 * SEG  # the last ACK's rate: more than five segments per ms
    k.run_until(3000 * MS + 1)
    # idle 3 s, a dozen RTOs: cwnd halved all the way back to 10; the window leaves at once as two packets of half of it
    assert snd.cwnd == 10 and snd.pacing_rate() == rate
    assert [p.segs for p in snd.inflight] == [5, 5]
    k.run_until()
    # back to back from the full token bucket: the line time of the ten segments, then L
    assert o["b"].got[1] == ("a", 10 * SEG, 3000 * MS + ns(15380, B) + L) == ("a", 14480, 3_011_230_400)


@pytest.mark.parametrize("host_rtt_us, segs", [(0, 45), (21, 45), (22, 34)])
def test_tso_autosizing_reads_the_minimum_rtt_with_the_hosts_share(build_kernel, host_rtt_us, segs):
    # tcp_tso_autosize adds gso_max_size >> (min_rtt_us >> 9): at L = 0.5 ms a small packet's round trip is
    # 2L + the line times of a 91-byte segment and a 90-byte ACK on both lines (1 000 us + 2 x (0.728 + 0.720) us
    # at 1 Gbit/s = 1 002.896 us); with the hosts' share up to 21 us the minimum stays under 1 024 us and the
    # bonus is 32 KB, from 22 us on 16 KB. An established connection at cwnd 20 and srtt 1 ms paces at
    # 120 % x 20 x 1 448 B / 1 ms = 34.752 MB/s: 33 937 B per 1/1024 s; + 32 768 = 66 705 -> 65 536, 45 segments;
    # + 16 384 = 50 321, 34 segments. The testbed's connections at 0.5 ms ended with minimum RTTs of
    # 1 009-1 041 us and split into both (docs/benchmarks.md, "The minimum RTT of a connection").
    B, L = 125e6, 500_000
    spec = replace(TCP, host_latency_ns=0, host_rtt_min_ns=host_rtt_us * 1000, host_rtt_max_ns=host_rtt_us * 1000)
    k, env, o = build_kernel({"a": (Sender, {"plan": [(0, "b", SEG)]}), "b": (Sink, {})},
                             latency_ns=L, bw=B, tcp=spec)
    k.run_until(1)
    snd = env.network._hosts[0].senders[1]
    assert snd.min_rtt == 1_002_896 and snd.host_rtt == host_rtt_us * 1000
    snd.cwnd, snd.ssthresh, snd.srtt8 = 20, 10, 1_000_000 << 3
    snd.update_pacing_rate()
    assert snd.pacing_rate() == 34_752_000 and snd.size_goal() == segs


def test_the_hosts_share_of_the_minimum_rtt_is_drawn_per_connection_and_keyed(build_kernel):
    spec = replace(TCP, host_latency_ns=0, host_rtt_min_ns=3_000, host_rtt_max_ns=80_000)
    draws = []
    for _ in range(2):
        plan = [(0, "b", SEG), (0, "c", SEG)]
        k, env, o = build_kernel({"a": (Sender, {"plan": plan}), "b": (Sink, {}), "c": (Sink, {})},
                                 latency_ns=MS, bw=125e6, tcp=spec)
        k.run_until()
        draws.append([env.network._hosts[0].senders[d].host_rtt for d in (1, 2)])
    assert draws[0] == draws[1]  # keyed: the same seed, the same draws
    assert draws[0][0] != draws[0][1] and all(3_000 <= h < 80_000 for h in draws[0])


def test_hystart_counts_its_rounds_from_the_first_ack_even_below_sixteen_segments(build_kernel):
    # Linux 6.14+ (commit 25c1a9ca53db, in the testbed's 6.18): the round bookkeeping runs on every ACK in
    # slow start; only the two detections wait for cwnd >= 16. Before it, the first round began at the
    # first ACK after cwnd reached 16, which made rounds (and ACK trains) start late.
    B = 125e6
    k, env, _ = build_kernel({"a": (Sender, {"plan": [(0, "b", 30 * SEG)]}), "b": (Sink, {})},
                             latency_ns=MS, bw=B, tcp=TCP)
    first_ack = ns(7690, B) + MS + ns(90, B) + MS  # the first packet of 5 out and its ACK back: 2 062 240 ns
    k.run_until(first_ack + 1)
    snd = env.network._hosts[0].senders[1]
    # at that ACK (cwnd 10) a round starts; it ends with the 10 segments sent so far
    assert (snd.round_start, snd.last_ack, snd.end_seq) == (first_ack, first_ack, 10 * SEG) == (2_062_240,
                                                                                                2_062_240, 14480)
    assert snd.cwnd == 15 and not snd.found


def test_a_packet_carries_at_most_half_the_window(build_kernel):
    # tcp_cwnd_test (Linux): "ensure we have at least 2 GSO packets in flight" -- the testbed's
    # captures show every first window leave as 5 + 4 segments (after gloo's 48-byte preamble)
    B = 125e6
    k, env, o = build_kernel({"a": (Sender, {"plan": [(0, "b", 10 * SEG)]}), "b": (Sink, {})},
                             latency_ns=MS, bw=B, tcp=TCP)
    k.run_until(1)
    assert [p.segs for p in env.network._hosts[0].senders[1].inflight] == [5, 5]
    k.run_until()
    assert o["b"].got == [("a", 10 * SEG, ns(15380, B) + MS)]  # back to back: the same line time in all



def test_the_send_buffer_holds_twice_the_window_as_linux_sizes_it():
    # tcp_sndbuf_expand: 2 x max(cwnd, 10) x per_mss, per_mss = roundup_pow2(1448 + 192 + 320) + 256 = 2 304;
    # the testbed's sockets report 46 080 for a new connection and 2 419 200 after a window of 525
    assert _sndbuf(TCP, 10, 0) == 2 * 10 * 2304 == 46_080
    assert _sndbuf(TCP, 525, 46_080) == 2 * 525 * 2304 == 2_419_200
    assert _sndbuf(TCP, 1000, 0) == 4 * 1024 * 1024  # net.ipv4.tcp_wmem[2]
    assert _sndbuf(TCP, 10, 100_000) == 100_000      # it never shrinks


@pytest.mark.parametrize("waiting, in_flight, sndbuf", [
    (True, 40, 2 * 100 * 2304),  # the application waits and the window is not full: twice the window
    (True, 100, 46_080),         # the window is full: tcp_should_expand_sndbuf says no
    (False, 40, 46_080),         # everything written fits: no SOCK_NOSPACE, no expansion
])
def test_the_send_buffer_grows_to_twice_the_window_only_while_the_application_waits_for_room(
        build_kernel, waiting, in_flight, sndbuf):
    k, env, _ = build_kernel({"a": (Sender, {"plan": [(0, "b", 10 * SEG)]}), "b": (Sink, {})},
                             latency_ns=MS, bw=125e6, tcp=TCP)
    k.run_until()
    snd = env.network._hosts[0].senders[1]
    assert snd.sndbuf == 46_080  # a 10-segment message never waited for room
    snd.cwnd, snd.packets_out = 100, in_flight
    snd.write_seq = snd.una + snd.sndbuf + (1 if waiting else 0)
    snd._check_space()
    assert snd.sndbuf == sndbuf


@pytest.mark.parametrize("waiting, cwnd, ssthresh, used", [
    (False, (100 + 20) >> 1, 75, 0),  # tcp_cwnd_application_limited: halfway to the window used, ssthresh 3/4 cwnd
    (True, 100, 50, 20),             # SOCK_NOSPACE: the application waits for room, the window is kept
])
def test_an_unfilled_window_decays_after_an_rto_only_if_the_application_has_written_everything(
        build_kernel, waiting, cwnd, ssthresh, used):
    # The testbed's PS downlinks keep cwnd 396 for 5 s with 110-187 segments in flight (TSQ, not the window,
    # limits them) while 1.2-2.4 MB wait in the 2.4 MB send buffer (docs/engine.md, "The send buffer").
    k, env, _ = build_kernel({"a": (Sender, {"plan": [(0, "b", 10 * SEG)]}), "b": (Sink, {})},
                             latency_ns=MS, bw=125e6, tcp=TCP)
    k.run_until()
    snd = env.network._hosts[0].senders[1]
    snd.cwnd, snd.ssthresh, snd.packets_out, snd.max_packets_out, snd.is_cwnd_limited = 100, 50, 20, 20, False
    snd.cwnd_used, snd.cwnd_stamp = 0, k.now - snd.rto
    snd.write_seq = snd.una + snd.sndbuf + (1 if waiting else 0)
    snd._cwnd_validate(False)
    assert (snd.cwnd, snd.ssthresh, snd.cwnd_used, snd.cwnd_stamp) == (cwnd, ssthresh, used, k.now)


@pytest.mark.parametrize("epoch, shifted", [
    (0, "by the idle time"),  # the cubic curve resumes where the sending stopped
    (None, None),             # no epoch yet (the connection never grew in congestion avoidance): nothing to shift
])
def test_cubic_shifts_its_epoch_by_the_idle_time_when_sending_resumes(build_kernel, epoch, shifted):
    # cubictcp_cwnd_event(CA_EVENT_TX_START), sent by tcp_event_data_sent when data leaves with nothing in
    # flight: epoch_start += now - lsndtime (jiffies, 4 ms at CONFIG_HZ 250), at most now. Without it the idle
    # time between a PS's transfers counted as time on the cubic curve: at the end of a PS's third transfer its
    # downlinks' clocks read about 16 s (targets up to 1 740 segments) instead of about 10 s of sending (496-532).
    k, env, _ = build_kernel({"a": (Sender, {"plan": [(0, "b", 100 * SEG), (3_000 * MS, "b", 10 * SEG)]}),
                              "b": (Sink, {"expect": 2})}, latency_ns=MS, bw=125e6, tcp=TCP)
    k.run_until(1_000 * MS)
    snd = env.network._hosts[0].senders[1]
    last_sent = env.network.jiffies(snd.lsndtime)
    assert last_sent > 0  # 100 segments take a few round trips: the last one left after jiffy 0
    snd.epoch_start = epoch
    k.run_until()
    resumed = env.network.jiffies(3_000 * MS)
    assert resumed == 750
    assert snd.epoch_start == (None if shifted is None else epoch + resumed - last_sent)


@pytest.mark.parametrize("small_first, found_at, ssthresh", [
    # min RTT = a small message's round trip: 2 L + two 91-byte segments and two 90-byte ACKs on the
    # lines = 2 028 960 ns, so the ACK train must last (2 028 960 + 1 ms) / 2 = 1 514 480 ns
    (True, 7_090_400, 30),
    # min RTT = the first packet's own round trip (2 622 400 ns): the train must last 1 811 200 ns
    (False, 11_189_280, 60),
])
def test_hystart_measures_its_ack_train_against_the_smallest_round_trip_seen(build_kernel, small_first,
                                                                             found_at, ssthresh):
    # 100 Mbit/s (a segment is 123 040 ns on the line, an ACK 7 200 ns), L = 1 ms, 60 segments.
    # cwnd 10: packets of 5 and 5 (ACKs at 2 622 400 and 3 237 600 ns); the first ACK makes cwnd 15
    # with 5 in flight: 7 and 3 segments leave (lines end 3 483 680, 3 852 800); the second makes it 20:
    # 10 segments (line ends 5 083 200). Their ACKs come back 2 007 200 ns after their line time ends:
    # 5 490 880 (a new round: cwnd 20 >= 16), 5 860 000 and 7 090 400 -- a train of 1 599 520 ns,
    # each gap under 2 ms. HyStart compares it with (min RTT + 1 ms) / 2 (the ACK delay allowance,
    # min(1 ms, 4 * 64 KiB / pacing rate), is 1 ms at these rates).
    B = 12.5e6
    tcp = replace(TCP, small_messages_first=small_first)
    k, env, _ = build_kernel({"a": (Sender, {"plan": [(0, "b", 60 * SEG)]}), "b": (Sink, {})},
                             latency_ns=MS, bw=B, tcp=tcp)
    snd = None
    for t in (5_490_880, 5_860_000, 7_090_400, 9_097_600, 9_220_640, 9_958_880, 11_189_280):
        k.run_until(t + 1)
        snd = env.network._hosts[0].senders[1]
        assert snd.last_ack == t
        if t == found_at:
            break
        assert not snd.found
    assert snd.found and snd.ssthresh == snd.cwnd == ssthresh
    small = 2 * MS + 2 * ns(91, B) + 2 * ns(90, B)
    assert snd.delay_min == (small if small_first else 2_622_400) and small == 2_028_960


def test_two_flows_starting_one_ms_apart_on_one_nic_share_its_line_in_order(build_kernel):
    B = 12.5e6  # 100 Mbit/s: a 10-segment packet takes 1.2304 ms on the line
    plan = [(0, "b", 10 * SEG), (MS, "c", 10 * SEG)]
    k, _, o = build_kernel({"a": (Sender, {"plan": plan}), "b": (Sink, {}), "c": (Sink, {})},
                           latency_ns=MS, bw=B, tcp=TCP)
    k.run_until()
    line = ns(15380, B)
    assert o["b"].got == [("a", 10 * SEG, line + MS)] == [("a", 14480, 2_230_400)]
    # the bucket lets c's packet go at 1 ms, but the line is busy with b's until 1.2304 ms
    assert o["c"].got == [("a", 10 * SEG, 2 * line + MS)] == [("a", 14480, 3_460_800)]


@pytest.mark.parametrize("wmem_bias, first_end", [(True, 6), (False, 4)])
def test_tcp_small_queues_keep_two_full_packets_of_a_flow_in_the_qdisc(build_kernel, monkeypatch, wmem_bias,
                                                                      first_end):
    # tcp_small_queue_check throttles a flow once sk_wmem_alloc > max(2 x truesize, pacing_rate >> 10), and
    # sk_wmem_alloc counts 1 for the socket itself: two full packets (2 x 66 184) already exceed 2 x 66 184.
    # The testbed's PS (capture of ps_sync K = 4, 10 ms, 1 Gbit/s, 1 MB) serves its four downlinks in turns
    # of two 64 KB packets, as here; without the socket's 1 they would go three at a time.
    import agents.sim.tcp as tcp_mod

    if not wmem_bias:
        monkeypatch.setattr(tcp_mod, "_WMEM_SOCKET", 0)
    B, L = 125e6, 10 * MS
    pkt = 45 * SEG  # 1 ms at 86.9 MB/s is 58 segments: TSO's 64 KiB cap makes it 45 (65 160 bytes)
    plan = [(0, "b", 4 * pkt), (0, "c", 4 * pkt)]
    k, env, o = build_kernel({"a": (Sender, {"plan": plan}), "b": (Sink, {}), "c": (Sink, {})},
                             latency_ns=L, bw=B, tcp=TCP)
    net = env.network
    host = net._host(0)
    for dst in (1, 2):  # established connections in congestion avoidance: cwnd 1 000, srtt = min RTT = 2L
        snd = host.senders[dst] = tcp_mod._Sender(net, host, dst, 2 * L)
        snd.cwnd, snd.ssthresh = 1000, 500
        snd.update_pacing_rate()  # as the last ACK with that window left it
        # pacing 120 % x 1 000 x 1 448 B / 20 ms = 86.88 MB/s, >> 10 = 84 843 B < 2 x (65 160 + 1 024)
        assert snd.size_goal() == 45 and snd.pacing_rate() >> 10 < 2 * (pkt + 1024)
    k.run_until()
    line = ns(pkt + 45 * 90, B)  # 69 210 wire bytes: 553.68 us
    # With the bias: b's first packet goes to the line at once, two wait in the qdisc (its fourth is held);
    # c's two follow; b's fourth comes when its second leaves: b1 b2 b3 c1 c2 b4 c3 c4 -- b done after the
    # 6th packet. Without it, b queues three and c three: b1..b4 c1..c4 -- b done after the 4th.
    assert o["b"].got == [("a", 4 * pkt, first_end * line + L)]
    assert o["c"].got == [("a", 4 * pkt, 8 * line + L)]


def test_two_senders_into_one_host_queue_at_its_switch_port(build_kernel):
    B = 12.5e6
    k, _, o = build_kernel({"a": (Sender, {"plan": [(0, "b", 10 * SEG)]}), "b": (Sink, {"expect": 2}),
                            "c": (Sender, {"plan": [(0, "b", 10 * SEG)]})}, latency_ns=MS, bw=B, tcp=TCP)
    k.run_until()
    line = ns(15380, B)
    # both lines finish at `line`; both reach b's port at line + L; the port serves a (lower id) first
    assert sorted(o["b"].got) == [("a", 14480, line + MS), ("c", 14480, 2 * line + MS)]


def test_a_small_message_waits_behind_a_packet_already_on_the_line(build_kernel):
    B = 12.5e6
    plan = [(0, "b", 10 * SEG), (0, "c", 4)]
    k, _, o = build_kernel({"a": (Sender, {"plan": plan}), "b": (Sink, {}), "c": (Sink, {})},
                           latency_ns=MS, bw=B, tcp=TCP)
    k.run_until()
    # both leave the bucket at 0; the 4-byte message (94 bytes of line time) follows the big one
    assert o["c"].got == [("a", 4, ns(15380, B) + ns(94, B) + MS)] == [("a", 4, 2_237_920)]


def test_host_latency_and_its_keyed_jitter_delay_every_delivered_message(build_kernel):
    B = 125e6
    base = ns(15380, B) + MS
    spec = replace(TCP, host_latency_ns=150_000)
    k, _, o = build_kernel({"a": (Sender, {"plan": [(0, "b", 10 * SEG)]}), "b": (Sink, {})},
                           latency_ns=MS, bw=B, tcp=spec)
    k.run_until()
    assert o["b"].got == [("a", 14480, base + 150_000)]
    got = []
    for seed in (0, 0, 1):
        k, _, o = build_kernel({"a": (Sender, {"plan": [(0, "b", 10 * SEG)]}), "b": (Sink, {})},
                               latency_ns=MS, bw=B, tcp=replace(TCP, host_latency_ns=150_000, host_jitter_ns=300_000),
                               seed=seed)
        k.run_until()
        got.append(o["b"].got[0][2])
    assert got[0] == got[1] and got[0] != got[2]  # a keyed draw: same seed, same delay
    assert min(got) > base + 150_000


def _ack_jitter(seed: int, ack_src: int, ack_dst: int, end: int, mean: int) -> int:
    """The keyed exponential draw of ``ack_delay`` for the ACK of bytes up to ``end`` (docs/engine.md)."""
    u = keyed.uniform(seed, "ack", ack_src, ack_dst, end)
    return int(-mean * math.log1p(-u))


@pytest.mark.parametrize("host_rtt, jitter", [(0, 300_000), (40_000, 0), (40_000, 300_000)])
def test_the_sender_acts_on_each_ack_after_the_hosts_share_of_the_round_trip_in_order(build_kernel, monkeypatch,
                                                                                      host_rtt, jitter):
    B = 125e6
    # Ten segments leave at 0 as two packets of 5 (7 690 wire bytes each); b acknowledges each on arrival,
    # so a's port releases the ACKs at r1 = e1 + 2L + ACK and r2 = r1 + one packet's line time. a acts on
    # them at t1 = r1 + H + d1 and t2 = max(r2 + H + d2, t1): H the connection's host_rtt, d the keyed
    # draws of mean ack_delay. The 11th segment leaves at t1 (cwnd 10 -> 15) and its ACK is acted on last.
    # A seed whose second draw is short enough to overtake the first shows the order.
    r1 = ns(7690, B) + MS + ns(90, B) + MS
    r2 = r1 + ns(7690, B)
    d = {seed: (_ack_jitter(seed, 1, 0, 5 * SEG, jitter), _ack_jitter(seed, 1, 0, 10 * SEG, jitter))
         for seed in range(50)}
    overtaking = next(s for s, (d1, d2) in d.items() if r2 + d2 < r1 + d1) if jitter else 1
    acted = []
    on_ack = tcp_model._Sender.on_ack
    monkeypatch.setattr(tcp_model._Sender, "on_ack",
                        lambda snd, seq, tsent: (acted.append((seq, snd.net.kernel.now)), on_ack(snd, seq, tsent)))
    spec = replace(TCP, host_rtt_min_ns=host_rtt, host_rtt_max_ns=host_rtt, ack_delay_ns=jitter)
    for seed in (0, overtaking):
        d1, d2 = d[seed]
        acted.clear()
        k, env, o = build_kernel({"a": (Sender, {"plan": [(0, "b", 11 * SEG)]}), "b": (Sink, {})},
                                 latency_ns=MS, bw=B, tcp=spec, seed=seed)
        k.run_until()
        t1 = r1 + host_rtt + d1
        assert o["b"].got == [("a", 11 * SEG, t1 + ns(1538, B) + MS)]
        t2 = max(r2 + host_rtt + d2, t1)
        r3 = t1 + ns(1538, B) + MS + ns(90, B) + MS
        t3 = max(r3 + host_rtt + _ack_jitter(seed, 1, 0, 11 * SEG, jitter), t2)
        assert acted == [(5 * SEG, t1), (10 * SEG, t2), (11 * SEG, t3)]
    if jitter:
        assert r2 + d[overtaking][1] < r1 + d[overtaking][0]  # the order rule was exercised
    k, env, o = build_kernel({"a": (Sender, {"plan": [(0, "b", 11 * SEG)]}), "b": (Sink, {})},
                             latency_ns=MS, bw=B, tcp=TCP)
    k.run_until()
    assert o["b"].got == [("a", 11 * SEG, r1 + ns(1538, B) + MS)]  # no share: acted on at arrival


class GlooMember(Worker):
    def __init__(self, name, vid, env, ring=(), nbytes=0, max_segment=0):
        super().__init__(name, vid, env)
        self.members, self.nbytes, self.max_segment = list(ring), nbytes, max_segment

    async def run(self):
        import torch

        vec = torch.full((self.nbytes // 4,), float(self.id + 1))
        self.out, _, _ = await gloo_ring_allreduce(self, vec, self.members, "t", max_segment=self.max_segment)
        self.done = self.now


@pytest.mark.parametrize("segments, expected", [
    # two ranks, s = 1000-byte segments, L = 5 ms, B = 1 MB/s (1 us per byte), ideal FIFO links.
    # Each phase (reduce-scatter, all-gather) a rank posts receives and sends of its first two
    # segments at once: four 48-byte notifications; the peer's NOTIFY_RECV_READY of segment 0 is
    # back after 48 us + L and the data (s + 48 bytes) follows, segment 1's right behind it:
    # 2 L + (2 s + 144) us per phase (two segments in flight).
    (2, 2 * (2 * 5 * MS + (2 * 1000 + 144) * 1000)),
    # A third segment is posted only once segment 0 has arrived (2 L + (s + 96) us): its receive
    # notification crosses (48 us + L) and its data follows (s + 48 us + L): 4 L + (2 s + 192) us.
    (3, 2 * (4 * 5 * MS + (2 * 1000 + 192) * 1000)),
])
def test_one_gloo_ring_all_reduce_keeps_two_segments_in_flight(build_kernel, segments, expected):
    ring = ["a", "b"]
    kw = {"ring": ring, "nbytes": 2 * segments * 1000, "max_segment": 1000}
    k, _, o = build_kernel({"a": (GlooMember, kw), "b": (GlooMember, kw)}, latency_ns=5 * MS, bw=1e6)
    k.run_until()
    assert o["a"].done == o["b"].done == expected
    assert o["a"].out.tolist() == o["b"].out.tolist() == [3.0] * (segments * 500)


class _PairMember(Worker):
    """One side of a gloo ring pair: ``a`` posts a send, then is busy (reducing) for ``busy`` ns; ``b`` posts
    the matching receive at 0 and waits for the data."""

    def __init__(self, name, vid, env, busy=0):
        super().__init__(name, vid, env)
        self.busy, self.got = busy, None

    async def run(self):
        import torch

        pair = _GlooPair(self, "t", "b" if self.name == "a" else "a", "b" if self.name == "a" else "a")
        if self.name == "a":
            pair.post_send("rs", 0, torch.zeros(250), None)  # 1000 bytes, not yet announced by b
            await self.sleep(self.busy)
            await pair.flush()
        else:
            pair.post_recv("rs", 0)
            await pair.wait_data("rs", 0)
            self.got = self.now
            await pair.flush()


def test_a_gloo_send_leaves_when_its_announcement_arrives_even_while_the_member_is_busy(build_kernel):
    """gloo's device thread answers a NOTIFY_RECV_READY whatever the member does (here: reducing a segment
    for 10 ms). L = 5 ms, 1 us per byte, FIFO links: b's 48-byte announcement reaches a at 48 us + L; the
    data (1000 + 48 bytes) leaves then, behind nothing (a's own 48-byte NOTIFY_SEND_READY left at 0), and
    reaches b 1048 us + L later: 2 L + 1096 us — not after a's 10 ms of work (that would be 16.048 ms)."""
    k, _, o = build_kernel({"a": (_PairMember, {"busy": 10 * MS}), "b": (_PairMember, {})},
                           latency_ns=5 * MS, bw=1e6)
    k.run_until()
    assert o["b"].got == 2 * 5 * MS + 1096 * 1000 == 11_096_000


class _StartsAt(Worker):
    """A gloo peer that starts its part ``at`` ns into the run."""

    def __init__(self, name, vid, env, at=0):
        super().__init__(name, vid, env)
        self.at = at

    async def started(self) -> GlooP2P:
        p2p = GlooP2P(self)
        if self.at:
            await self.sleep(self.at)
        return p2p


class P2PSender(_StartsAt):
    async def run(self):
        p2p = await self.started()
        p2p.send("b", None, tag="x", nbytes=1000)
        await self.recv(tag="never")  # stays up: its device thread answers the announcement


class P2PReceiver(_StartsAt):
    async def run(self):
        p2p = await self.started()
        p2p.post_recv("a", "x")
        m = await self.recv(tag="x")
        self.got = (m.nbytes, m.delivered_at)


@pytest.mark.parametrize("send_at, recv_at, expected", [
    # L = 5 ms, B = 1 MB/s (1 us per byte), ideal FIFO links. The receive is posted first: its 48-byte
    # announcement reaches the sender at 48 us + L; the send at 10 ms finds it and the data op (48-byte
    # preamble + 1000 bytes) leaves at once: 10 ms + 1048 us + L.
    (10 * MS, 0, 10 * MS + 1048 * 1000 + 5 * MS),
    # The send comes first: it announces itself (48 bytes, nothing to do for the receiver) and waits; the
    # receive posted at 10 ms is announced (48 us + L) and the data follows (1048 us + L).
    (0, 10 * MS, 10 * MS + 48 * 1000 + 5 * MS + 1048 * 1000 + 5 * MS),
])
def test_a_gloo_send_starts_once_the_receivers_announcement_has_arrived(build_kernel, send_at, recv_at, expected):
    k, _, o = build_kernel({"a": (P2PSender, {"at": send_at}), "b": (P2PReceiver, {"at": recv_at})},
                           latency_ns=5 * MS, bw=1e6)
    k.run_until()
    assert o["b"].got == (1048, expected)


def test_the_receiver_acknowledges_like_linux_with_delayed_ack(build_kernel):
    """``delayed_ack``: L = 1 ms, 1 Gbit/s, host latency 100 us. A one-segment message (1538 bytes on the
    line: 12 304 ns) reaches b 1 012 304 ns after it is sent. The first data arms 16 quick ACKs (sent on
    arrival); the 17th lone segment, a full one, waits for the delayed-ACK timer (40 ms); a short packet
    is acknowledged when the application reads it (100 us after it arrives); after a gap longer than the
    RTO (200 ms) quick ACKs are armed again."""
    plan = [(i * 10 * MS, "b", SEG) for i in range(17)] + [(300 * MS, "b", 100), (600 * MS, "b", SEG)]
    spec = replace(TCP, host_latency_ns=100_000, delayed_ack=True)
    k, env, o = build_kernel({"a": (Sender, {"plan": plan}), "b": (Sink, {"expect": len(plan)})},
                             latency_ns=MS, bw=125e6, tcp=spec)
    acks = []
    enqueue = env.network.enqueue

    def record(host, pkt):
        if pkt.ack:
            acks.append((k.now, pkt.end))
        enqueue(host, pkt)

    env.network.enqueue = record
    k.run_until()
    arrive = [t + 1_012_304 for t, _, _ in plan[:17]]
    assert acks[:16] == [(t, (i + 1) * SEG) for i, t in enumerate(arrive[:16])]  # quick ACKs, at once
    assert acks[16] == (arrive[16] + 40 * MS, 17 * SEG)  # the delayed ACK
    assert acks[17] == (300 * MS + 1520 + MS + 100_000, 17 * SEG + 100)  # 190 bytes on the line; read 100 us later
    assert acks[18] == (600 * MS + 1_012_304, 18 * SEG + 100)  # 300 ms of silence: quick ACKs again
    assert len(acks) == 19


def test_without_delayed_ack_every_packet_is_acknowledged_on_arrival(build_kernel):
    plan = [(0, "b", SEG), (300 * MS, "b", 100)]
    k, env, o = build_kernel({"a": (Sender, {"plan": plan}), "b": (Sink, {"expect": 2})},
                             latency_ns=MS, bw=125e6, tcp=replace(TCP, host_latency_ns=100_000))
    acks = []
    enqueue = env.network.enqueue
    env.network.enqueue = lambda host, pkt: (acks.append(k.now) if pkt.ack else None, enqueue(host, pkt))
    k.run_until()
    assert acks == [1_012_304, 300 * MS + 1520 + MS]


class _Asks(Worker):
    """a: one segment to b, then (once b's reply is in) 100 bytes, and 100 bytes more at 100 ms."""

    async def run(self):
        self.send("b", None, nbytes=SEG, tag="m")
        await self.recv()
        self.send("b", None, nbytes=100, tag="m")
        await self.sleep(100 * MS - self.now)
        self.send("b", None, nbytes=100, tag="m")


class _Answers(Worker):
    """b: answers a's first message with 100 bytes at once, then only receives."""

    async def run(self):
        await self.recv()
        self.send("a", None, nbytes=100, tag="r")
        await self.recv()
        await self.recv()


def test_a_receiver_that_answers_at_once_leaves_short_packets_to_the_delayed_ack_timer(build_kernel):
    """Pingpong mode (``delayed_ack``): b answers a's first segment (here at 1 012 304 ns, acknowledged at
    once: quick ACKs) when its application has it, 100 us later — within ``delack`` of receiving — so b is
    in pingpong mode: a's next short packet (b's port at 3 215 344 ns: the reply's 190 bytes take 1 520 ns
    and L each way, a answers 100 us after it arrives) is neither quick-ACKed nor ACKed on read, but after
    the 40 ms timer, which ends pingpong; the next short packet, 100 ms after the start, is quick-ACKed."""
    k, env, o = build_kernel({"a": (_Asks, {}), "b": (_Answers, {})}, latency_ns=MS, bw=125e6,
                             tcp=replace(TCP, host_latency_ns=100_000, delayed_ack=True))
    acks = []
    enqueue = env.network.enqueue

    def record(host, pkt):
        if pkt.ack and pkt.src == 1:
            acks.append((k.now, pkt.end))
        enqueue(host, pkt)

    env.network.enqueue = record
    k.run_until()
    second = 1_012_304 + 100_000 + 1_001_520 + 100_000 + 1_001_520
    assert second == 3_215_344
    assert acks == [(1_012_304, SEG), (second + 40 * MS, SEG + 100), (100 * MS + 1_001_520, SEG + 200)]


class _AfterBarrier(Worker):
    """b: ``heard``/``answered`` from a in a barrier at 0 (None: no barrier), a 48-byte announcement to a at 1 ms
    (``notify``), then a's packet."""

    def __init__(self, name, vid, env, heard=None, answered=False, notify=True):
        super().__init__(name, vid, env)
        self.heard, self.answered, self.notify = heard, answered, notify

    async def run(self):
        if self.heard is not None:
            self.env.network.barrier_history(self, self.heard, {0} if self.answered else set())
        await self.sleep(MS)
        if self.notify:
            self.send("a", None, nbytes=48, tag="rr")
        await self.recv(tag="m")


@pytest.mark.parametrize("heard, answered, notify, delayed", [
    (None, False, True, False),  # a fresh connection: the first data arms quick ACKs
    ([0], False, True, True),    # heard in the barrier, answered with the announcement 1 ms later: pingpong
    ([0], True, False, True),    # answered in the barrier itself: pingpong
    ([0], False, False, False),  # heard, never answered: quick ACKs (15 left)
    ([], False, True, False),    # a barrier that did not touch this connection
])
def test_a_connection_remembers_the_barrier_before_its_first_tensor(build_kernel, heard, answered, notify, delayed):
    """gloo's barrier before the first tensor (``delayed_ack``; docs/engine.md, "Connections before the first
    tensor"): a's 100 bytes leave at 5 ms and reach b at 5 ms + 1 520 ns (190 bytes at 1 Gbit/s) + 1 ms. b
    acknowledges them at once (quick ACKs), or, in pingpong mode — it answered within ``delack`` of hearing
    from a — after the 40 ms delayed-ACK timer."""
    k, env, o = build_kernel({"a": (Sender, {"plan": [(5 * MS, "b", 100)]}),
                              "b": (_AfterBarrier, {"heard": heard, "answered": answered, "notify": notify})},
                             latency_ns=MS, bw=125e6, tcp=replace(TCP, host_latency_ns=0, delayed_ack=True))
    acks = []
    enqueue = env.network.enqueue

    def record(host, pkt):
        if pkt.ack and pkt.src == 1:
            acks.append(k.now)
        enqueue(host, pkt)

    env.network.enqueue = record
    k.run_until()
    arrive = 5 * MS + 1520 + MS
    assert acks == [arrive + (40 * MS if delayed else 0)]


def test_without_delayed_ack_the_barrier_leaves_nothing(build_kernel):
    """Without ``delayed_ack`` every packet is acknowledged on arrival, barrier or not."""
    k, env, o = build_kernel({"a": (Sender, {"plan": [(5 * MS, "b", 100)]}),
                              "b": (_AfterBarrier, {"heard": [0], "answered": True})},
                             latency_ns=MS, bw=125e6, tcp=replace(TCP, host_latency_ns=0))
    acks = []
    enqueue = env.network.enqueue
    env.network.enqueue = lambda host, pkt: (acks.append(k.now) if pkt.ack and pkt.src == 1 else None,
                                             enqueue(host, pkt))
    k.run_until()
    assert acks == [5 * MS + 1520 + MS]
