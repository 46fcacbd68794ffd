"""The ``tcp`` transport model (DESIGN §4.1, docs/engine.md "Transport model"): Linux TCP over Ethernet.

Where the ``ideal`` network moves whole messages through processor-sharing or FIFO
stations, this model moves what a Linux host really hands to its NIC: TSO/GSO packets
(up to 64 KiB, sized from the pacing rate), clocked by ACKs and a congestion window.

* **Host**: one FIFO queue per vworker (the qdisc) drained by a token bucket of depth
  ``nic_burst`` at the line rate ``B`` — what the NIC accepts ahead of the wire. TCP
  small queues (TSQ) keep each connection's bytes in it at about two packets.
* **Wire and switch**: a released packet is serialised on the sender's link
  (``e = max(t, egress_free) + w/B``), crosses the latency ``L`` and is serialised on the
  receiver's switch port (``r = max(e + L, port_free + w/B_in)``), the port serving packets
  in the order they left their hosts (cut-through: an idle path costs ``w/B + L`` once).
  ``w`` counts every segment's TCP/IP header and Ethernet framing, so the goodput of a
  bulk transfer is ``(MTU − header) / (MTU + frame)`` of the line rate (1448/1538 = 94.1 %).
* **TCP** (Linux 6.x defaults, loss-free network): initial window 10 segments, slow start
  on ACKs while cwnd-limited, HyStart, CUBIC's growth without a loss (at least 5 % per RTT, up
  to 1.5 x while the cubic curve is far above the window; its clock paused while the connection
  sends nothing), the RTT estimator and retransmission timeout (min 200 ms), restart after idle
  (cwnd halved per RTO of idle, ``tcp_slow_start_after_idle``), the application-limited decay
  (not while the application waits for room in the autotuned send buffer), TSO autosizing and
  TSQ. One ACK per received packet; with ``delayed_ack``, Linux's receiver policy instead (quick
  ACKs, ACK on read for short packets, the delayed-ACK timer, ACKs riding data).
* **Host software**: a message reaches its application ``host_latency`` after its last
  byte (system calls, a thread wake-up), plus a keyed exponential jitter of mean
  ``host_jitter`` drawn per message — what makes real workers drift apart. A sender acts
  on an ACK the hosts' share of a round trip after it arrived (the stacks, the bridge):
  ``host_rtt`` per connection plus a keyed exponential draw of mean ``ack_delay`` per ACK,
  a connection's ACKs kept in order — so two connections that share a NIC do not take
  their slow-start rounds in lockstep.

Every time is an integer nanosecond and every draw is keyed, so results are identical
whatever the placement of vworkers on agents. A connection's sender state lives on the
sender's agent, its receiver state and the receiver's switch port on the receiver's: a
packet is announced to the receiver's port when it leaves its host (``t + L``, never
earlier than the lookahead), and ACKs travel back the same way.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agents.sim import keyed
from agents.sim.kernel import PRIO_NET, Kernel
from agents.sim.network import NetworkSpec, Transfer, payload_nbytes
from agents.sim.types import NS_PER_S, VirtualTime
from agents.sim.worker import Message, SendHandle

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.env import Environment
    from agents.sim.worker import Worker

__all__ = ["TcpSpec", "TcpNetwork", "goodput_fraction", "wire_bytes"]

_INFINITE_SSTHRESH = 0x7FFFFFFF
_WMEM_SOCKET = 1  # sk_wmem_alloc starts at 1 (the socket's own reference): TSQ compares it, not the skbs alone


@dataclass(frozen=True)
class TcpSpec:
    """Physical parameters of the ``tcp`` transport (conf/network/tcp.yaml; docs/engine.md)."""

    mtu: int = 1500                 # IP packet size of a full segment
    header_bytes: int = 52          # IPv4 20 + TCP 20 + timestamp option 12, per segment
    frame_bytes: int = 38           # Ethernet header 14 + FCS 4 + preamble 8 + inter-frame gap 12
    initial_window: int = 10        # segments (RFC 6928, Linux TCP_INIT_CWND)
    gso_max_bytes: int = 65536      # largest TSO/GSO packet
    nic_burst_bytes: int = 72_887   # wire bytes the NIC takes ahead of the line rate (a token bucket)
    rto_min_ns: int = 200_000_000   # TCP_RTO_MIN
    clock_hz: int = 250             # the kernel's jiffy clock (CONFIG_HZ), the RTO's resolution
    slow_start_after_idle: bool = True
    hystart_delay: bool = True       # leave slow start when the round's minimum RTT rises (HyStart)
    hystart_ack_train: bool = True   # ... or on an ACK train of half the minimum RTT (Linux: both)
    tsq_limit_bytes: int = 4 * 1024 * 1024  # net.ipv4.tcp_limit_output_bytes
    wmem_max_bytes: int = 4 * 1024 * 1024  # net.ipv4.tcp_wmem[2]: the largest send buffer autotuning gives
    host_latency_ns: int = 257_000  # application-visible delay of a delivered message (calibrated)
    host_jitter_ns: int = 0         # mean of a keyed exponential extra delay per message
    ack_delay_ns: int = 30_000      # mean of the keyed exponential part of the hosts' share of a round trip
    host_rtt_min_ns: int = 3_000    # the hosts' share of a connection's minimum RTT: keyed uniform per connection
    host_rtt_max_ns: int = 80_000   # in [min, max]; every ACK waits it (measured: lab/min-rtt.jsonl)
    small_messages_first: bool = True  # CUBIC's minimum RTT starts at a small message's round trip
    delayed_ack: bool = False  # the receiver's ACK policy of Linux (quick ACKs, ACK on read, delayed ACK)
    delack_ns: int = 40_000_000  # TCP_DELACK_MIN / TCP_ATO_MIN: the delayed-ACK timer

    @property
    def mss(self) -> int:
        return self.mtu - self.header_bytes

    def __post_init__(self) -> None:
        if self.mss <= 0:
            raise ValueError(f"tcp: mtu={self.mtu} leaves no payload after header_bytes={self.header_bytes}")
        for name in ("initial_window", "gso_max_bytes", "clock_hz", "wmem_max_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"tcp: {name}={getattr(self, name)} must be positive")
        for name in ("frame_bytes", "rto_min_ns", "host_latency_ns", "host_jitter_ns", "ack_delay_ns",
                     "tsq_limit_bytes", "host_rtt_min_ns"):
            if getattr(self, name) < 0:
                raise ValueError(f"tcp: {name}={getattr(self, name)} must not be negative")
        if self.host_rtt_max_ns < self.host_rtt_min_ns:
            raise ValueError(f"tcp: host_rtt_max_ns={self.host_rtt_max_ns} is below host_rtt_min_ns="
                             f"{self.host_rtt_min_ns}")
        biggest = wire_bytes(self, (self.gso_max_bytes // self.mss) * self.mss)
        if self.nic_burst_bytes < biggest:
            raise ValueError(f"tcp: nic_burst_bytes={self.nic_burst_bytes} is below one full GSO packet "
                             f"({biggest} wire bytes); the NIC could never send it")


def wire_bytes(spec: TcpSpec, payload: int) -> int:
    """Bytes on the wire for ``payload`` bytes of TCP data (at least one segment: a bare ACK is 0 bytes)."""
    segs = max(1, -(-payload // spec.mss))
    return payload + segs * (spec.header_bytes + spec.frame_bytes)


def goodput_fraction(spec: TcpSpec) -> float:
    """Payload per wire byte of full segments: 1448/1538 for Ethernet with TCP timestamps."""
    return spec.mss / (spec.mtu + spec.frame_bytes)


class _Packet:
    """A TSO/GSO packet (data) or an ACK, from host ``src`` to host ``dst``."""

    __slots__ = ("src", "dst", "ack", "start", "end", "segs", "tsent", "truesize", "wire", "msgs", "e_done")

    def __init__(self, src: int, dst: int, ack: bool, start: int, end: int, segs: int, tsent: VirtualTime,
                 wire: int, msgs: tuple = ()):
        self.src, self.dst, self.ack = src, dst, ack
        self.start, self.end, self.segs, self.tsent = start, end, segs, tsent
        self.truesize = (end - start) + 1024  # the skb's memory, as TSQ counts it
        self.wire = wire
        self.msgs = msgs  # messages whose last byte this packet carries
        self.e_done: VirtualTime = 0


class _Msg:
    __slots__ = ("start", "end", "src_name", "dst_name", "seq", "tag", "payload", "nbytes", "sent_at", "first_out",
                 "latency", "handle")

    def __init__(self, end: int, src_name: str, dst_name: str, seq: int, tag: Any, payload: Any, nbytes: int,
                 sent_at: VirtualTime, handle: SendHandle):
        self.start, self.end, self.src_name, self.dst_name, self.seq = 0, end, src_name, dst_name, seq
        self.tag, self.payload, self.nbytes, self.sent_at, self.handle = tag, payload, nbytes, sent_at, handle
        self.first_out: VirtualTime | None = None
        self.latency: VirtualTime = 0


class _Host:
    """A vworker's NIC: qdisc, token bucket, sender link and receiver switch port."""

    __slots__ = ("worker", "queue", "busy", "credit", "credit_t", "egress_free", "port_free", "senders",
                 "receivers", "rate_out", "rate_in", "burst_ns")

    def __init__(self, worker: "Worker", rate_out: float, rate_in: float, burst_ns: int):
        self.worker = worker
        self.queue: deque[_Packet] = deque()
        self.busy = False
        self.credit, self.credit_t = burst_ns, 0  # token bucket, in ns of line time
        self.egress_free: VirtualTime = 0
        self.port_free: VirtualTime = 0
        self.senders: dict[int, _Sender] = {}
        self.receivers: dict[int, _Receiver] = {}
        self.rate_out, self.rate_in, self.burst_ns = rate_out, rate_in, burst_ns


QUICKACKS = 16  # TCP_MAX_QUICKACKS


class _Receiver:
    __slots__ = ("rcv_nxt", "last_release", "wup", "quick", "lrcv", "timer", "timer_at", "tsent", "tlast",
                 "pingpong", "pushed")

    def __init__(self) -> None:
        self.rcv_nxt = 0
        self.last_release: VirtualTime = 0
        # delayed_ack: rcv_nxt when the last ACK left (rcv_wup), quick ACKs left, the last data's arrival,
        # the pending ACK's timer and time, and the send times of the oldest unacknowledged packet (tsent)
        self.wup = 0
        self.quick = 0
        self.lrcv: VirtualTime | None = None
        self.timer: Any = None
        self.timer_at: VirtualTime = 0
        self.tsent: VirtualTime | None = None
        self.tlast: VirtualTime = 0  # ... and of the newest
        self.pingpong = False  # the host answered within delack of receiving (inet_csk_in_pingpong_mode)
        self.pushed = 0  # short packets not yet acknowledged (ICSK_ACK_PUSHED, PUSHED2)


class _AckTimer:
    """A pending ACK's timer (an object, not a closure, so that a checkpoint can save it)."""

    __slots__ = ("model", "host", "src", "rcv", "delayed")

    def __init__(self, model: Any, host: Any, src: int, rcv: _Receiver, delayed: bool):
        self.model, self.host, self.src, self.rcv, self.delayed = model, host, src, rcv, delayed

    def __call__(self) -> None:
        if self.delayed:  # the delayed-ACK timer went off: leave pingpong mode (tcp_delack_timer_handler)
            self.rcv.pingpong = False
        self.model.send_ack(self.host, self.src, self.rcv)


class _Sender:
    """One TCP connection's sender (Linux tcp_output.c / tcp_input.c / tcp_cubic.c, loss-free)."""

    ack_ready: VirtualTime = 0  # when the sender acted on the newest ACK (``ack_delay``: ACKs keep their order)

    def __init__(self, net: "TcpNetwork", host: _Host, dst: int, rtt0: VirtualTime,
                 base_rtt: VirtualTime | None = None):
        self.net, self.host, self.dst = net, host, dst
        s = net.tcp
        self.cwnd = s.initial_window
        self.ssthresh = _INFINITE_SSTHRESH
        self.una = self.nxt = self.write_seq = 0
        self.packets_out = 0
        self.inflight: deque[_Packet] = deque()
        self.msgs: deque[_Msg] = deque()  # written, last byte not yet packetised
        self.qdisc_bytes = 0
        # RTT estimator (Linux keeps srtt x8 and mdev x4); the handshake gave the first sample
        self.srtt8 = self.mdev = self.mdev_max = self.rttvar = 0
        self.rtt_seq = 0
        self.rto: VirtualTime = 0
        self.min_rtt: VirtualTime | None = None
        self._rtt_sample(rtt0)
        if base_rtt is not None:  # the handshake and gloo's small messages: small packets' round trips
            self.min_rtt = max(self.min_rtt, base_rtt)
        # what the hosts' stacks add to every round trip, the constant part: a draw per connection that each of
        # its ACKs waits (with a keyed exponential draw of mean ack_delay) before the sender acts on it, and
        # that TSO autosizing adds to the handshake's and small messages' round trips, as Linux's minimum RTT
        # (tcp_min_rtt) holds it (docs/benchmarks.md, "The minimum RTT of a connection", "The hosts' share of
        # a round trip")
        self.host_rtt = net.host_rtt(host.worker.id, dst)
        # sk_pacing_rate: set from cwnd and srtt when an ACK has been processed (tcp_update_pacing_rate, the
        # end of tcp_cong_control), read in between: a restart after idle keeps the rate of the last ACK
        self.pacing = 0
        self.update_pacing_rate()
        self.lsndtime: VirtualTime | None = None
        self.is_cwnd_limited = False
        self.max_packets_out = 0
        self.cwnd_usage_seq = 0
        self.cwnd_used = 0
        self.cwnd_stamp: VirtualTime = 0
        self.cwnd_cnt = 0
        self.sndbuf = _sndbuf(s, s.initial_window, 0)  # tcp_init_buffer_space's first tcp_sndbuf_expand
        # CUBIC without a loss: W_max stays 0
        self.epoch_start: int | None = None
        self.last_cwnd = 0
        self.last_time = -1
        self.origin = 0
        self.ack_cnt = 0
        self.tcp_cwnd = 0
        self.cnt = 20
        # CUBIC's minimum RTT (HyStart's reference): from the connection's own ACKed data, or, when it
        # carried small messages before (gloo's setup, barrier and notifications), their round trip
        self.delay_min: VirtualTime | None = base_rtt
        self.found = False
        self.round_start: VirtualTime = 0
        self.last_ack: VirtualTime = 0
        self.end_seq = 0
        self.curr_rtt: VirtualTime | None = None
        self.sample_cnt = 0

    # -------------------------------------------------------------- app side
    def write(self, msg: _Msg, size: int) -> None:
        now = self.net.kernel.now
        s = self.net.tcp
        if s.slow_start_after_idle and self.packets_out == 0 and self.lsndtime is not None:
            delta = self.net.jiffies(now) - self.net.jiffies(self.lsndtime)
            rto_j = self.net.rto_jiffies(self.rto)
            if delta > rto_j:
                self._cwnd_restart(delta, rto_j)
        msg.start = self.write_seq
        self.write_seq += size
        msg.end = self.write_seq
        self.msgs.append(msg)
        self.try_send()

    def _cwnd_restart(self, delta: int, rto_j: int) -> None:
        """tcp_cwnd_restart: halve cwnd once per RTO of idle beyond the first, not below the initial window."""
        restart = min(self.net.tcp.initial_window, self.cwnd)
        self.ssthresh = self._current_ssthresh()
        cwnd = self.cwnd
        delta -= rto_j
        while delta > 0 and cwnd > restart:
            cwnd >>= 1
            delta -= rto_j
        self.cwnd = max(cwnd, restart)
        self.cwnd_stamp = self.net.kernel.now
        self.cwnd_used = 0

    def _current_ssthresh(self) -> int:
        return max(self.ssthresh, (self.cwnd >> 1) + (self.cwnd >> 2))

    # ---------------------------------------------------------------- output
    def pacing_rate(self) -> int:
        """Bytes/s, as of the last ACK processed (``sk_pacing_rate``)."""
        return self.pacing

    def update_pacing_rate(self) -> None:
        """tcp_update_pacing_rate: 200 % (cwnd below half ssthresh) or 120 % of max(cwnd, in flight)·MSS/srtt."""
        ratio = 200 if self.cwnd < self.ssthresh // 2 else 120
        srtt = max(1, self.srtt8 >> 3)
        self.pacing = self.net.tcp.mss * ratio * max(self.cwnd, self.packets_out) * NS_PER_S // (100 * srtt)

    def size_goal(self) -> int:
        """Segments per TSO packet (tcp_tso_autosize): 1 ms at the pacing rate, more on short paths."""
        s = self.net.tcp
        nbytes = self.pacing_rate() >> 10
        r = ((self.min_rtt + self.host_rtt) // 1000) >> 9 if self.min_rtt is not None else 0
        if r < 32:
            nbytes += s.gso_max_bytes >> r
        nbytes = min(nbytes, s.gso_max_bytes)
        return max(nbytes // s.mss, 2)

    def try_send(self) -> None:
        net, s = self.net, self.net.tcp
        now = net.kernel.now
        sent = False
        cwnd_limited = False
        while self.write_seq > self.nxt:
            # tcp_cwnd_test: at most half the window per packet, so that at least two are in flight
            quota = min(self.cwnd - self.packets_out, max(self.cwnd >> 1, 1))
            if quota <= 0:
                cwnd_limited = True
                break
            unsent = self.write_seq - self.nxt
            segs = min(self.size_goal(), quota, -(-unsent // s.mss))
            nbytes = min(unsent, segs * s.mss)
            segs = -(-nbytes // s.mss)
            if len(self.inflight) > 1:  # TSQ (tcp_small_queue_check)
                limit = min(max(2 * (nbytes + 1024), self.pacing_rate() >> 10), s.tsq_limit_bytes)
                if self.qdisc_bytes + _WMEM_SOCKET > limit:
                    break
            start = self.nxt
            self.nxt += nbytes
            done = []
            while self.msgs and self.msgs[0].end <= self.nxt:
                done.append(self.msgs.popleft())
            pkt = _Packet(self.host.worker.id, self.dst, False, start, self.nxt, segs, now,
                          wire_bytes(s, nbytes), tuple(done))
            for m in done + [m for m in self.msgs if m.start < self.nxt]:
                if m.first_out is None:
                    m.first_out = now
            if self.packets_out == 0 and self.epoch_start is not None:
                # tcp_event_data_sent -> CA_EVENT_TX_START: CUBIC shifts its epoch by the idle time, so the
                # cubic curve resumes where sending stopped (cubictcp_cwnd_event). An epoch began on an ACK,
                # so data was sent before: lsndtime is set.
                assert self.lsndtime is not None
                jt = net.jiffies(now)
                delta = jt - net.jiffies(self.lsndtime)
                if delta > 0:
                    self.epoch_start = min(self.epoch_start + delta, jt)
            self.packets_out += segs
            self.inflight.append(pkt)
            self.qdisc_bytes += pkt.truesize
            self.lsndtime = now
            sent = True
            if self.packets_out >= self.cwnd:
                cwnd_limited = True
            if s.delayed_ack:  # the data carries the ACK its host owes the peer
                rcv = self.host.receivers.get(self.dst)
                if rcv is not None:
                    if rcv.lrcv is not None and now - rcv.lrcv < s.delack_ns:  # tcp_event_data_sent: a reply
                        rcv.pingpong = True
                    if rcv.wup < rcv.rcv_nxt:
                        net.send_ack(self.host, self.dst, rcv)
            net.enqueue(self.host, pkt)
        if sent or cwnd_limited:
            self._cwnd_validate(cwnd_limited)

    def _cwnd_validate(self, is_cwnd_limited: bool) -> None:
        """tcp_cwnd_validate: track use of the window; decay it after an RTO of application-limited sending."""
        now = self.net.kernel.now
        if self.una >= self.cwnd_usage_seq or is_cwnd_limited or (
                not self.is_cwnd_limited and self.packets_out > self.max_packets_out):
            self.is_cwnd_limited = is_cwnd_limited
            self.max_packets_out = self.packets_out
            self.cwnd_usage_seq = self.nxt
        if self._cwnd_limited():
            self.cwnd_used = 0
            self.cwnd_stamp = now
        else:
            self.cwnd_used = max(self.cwnd_used, self.packets_out)
            if self.net.tcp.slow_start_after_idle and now - self.cwnd_stamp >= self.rto:
                if not self._nospace():  # tcp_cwnd_application_limited: only once the application wrote all
                    win_used = max(self.cwnd_used, self.net.tcp.initial_window)
                    if win_used < self.cwnd:
                        self.ssthresh = self._current_ssthresh()
                        self.cwnd = (self.cwnd + win_used) >> 1
                    self.cwnd_used = 0
                self.cwnd_stamp = now

    def _cwnd_limited(self) -> bool:
        if self.is_cwnd_limited:
            return True
        if self.cwnd < self.ssthresh:  # in slow start, grow to twice what was in flight
            return self.cwnd < 2 * self.max_packets_out
        return False

    # ----------------------------------------------------------------- input
    def on_ack(self, ack_seq: int, tsent: VirtualTime | tuple[VirtualTime, VirtualTime]) -> None:
        """``tsent``: when the acknowledged packet left; with ``delayed_ack`` (oldest, newest) of those an ACK
        covers — the RTT estimator takes the oldest, CUBIC and HyStart the newest (``tcp_clean_rtx_queue``:
        ``seq_rtt_us`` and the rate sample's ``rtt_us``)."""
        acked = 0
        while self.inflight and self.inflight[0].end <= ack_seq:
            acked += self.inflight.popleft().segs
        if not acked:
            return
        now = self.net.kernel.now
        self.una = ack_seq
        self.packets_out -= acked
        if isinstance(tsent, tuple):
            self._rtt_sample(now - tsent[0])
            rtt = now - tsent[1]
        else:
            rtt = now - tsent
            self._rtt_sample(rtt)
        if self.delay_min is None or rtt < self.delay_min:
            self.delay_min = rtt
        s = self.net.tcp
        if (s.hystart_delay or s.hystart_ack_train) and not self.found and self.cwnd < self.ssthresh:
            self._hystart_update(rtt)
        if self._cwnd_limited():
            if self.cwnd < self.ssthresh:  # tcp_slow_start
                cwnd = min(self.cwnd + acked, self.ssthresh)
                acked -= cwnd - self.cwnd
                self.cwnd = cwnd
            if acked > 0:  # congestion avoidance: tcp_cong_avoid_ai with CUBIC's cnt
                self._cubic_update(acked)
                w = self.cnt
                if self.cwnd_cnt >= w:
                    self.cwnd_cnt = 0
                    self.cwnd += 1
                self.cwnd_cnt += acked
                if self.cwnd_cnt >= w:
                    d = self.cwnd_cnt // w
                    self.cwnd_cnt -= d * w
                    self.cwnd += d
        self.update_pacing_rate()
        self.try_send()
        self._check_space()

    def _nospace(self) -> bool:
        """SOCK_NOSPACE: the application has more to write than the send buffer holds (what is unacknowledged
        stays in it), so it waits for room."""
        return self.write_seq - self.una > self.sndbuf

    def _check_space(self) -> None:
        """tcp_check_space after an ACK: while the application waits for room and the window is not full,
        the buffer grows to twice the window (tcp_new_space, tcp_should_expand_sndbuf, tcp_sndbuf_expand)."""
        if self.packets_out < self.cwnd and self._nospace():
            self.sndbuf = _sndbuf(self.net.tcp, self.cwnd, self.sndbuf)

    def _rtt_sample(self, m: VirtualTime) -> None:
        """tcp_rtt_estimator and __tcp_set_rto (Jacobson/Karels with Linux's mdev_max and RTO floor)."""
        if self.min_rtt is None or m < self.min_rtt:
            self.min_rtt = m
        rto_min = self.net.tcp.rto_min_ns
        if self.srtt8 == 0:
            self.srtt8 = m << 3
            self.mdev = m << 1
            self.rttvar = max(self.mdev, rto_min)
            self.mdev_max = self.rttvar
            self.rtt_seq = self.nxt
        else:
            m -= self.srtt8 >> 3
            self.srtt8 += m
            if m < 0:
                m = -m - (self.mdev >> 2)
                if m > 0:
                    m >>= 3
            else:
                m -= self.mdev >> 2
            self.mdev += m
            if self.mdev > self.mdev_max:
                self.mdev_max = self.mdev
                if self.mdev_max > self.rttvar:
                    self.rttvar = self.mdev_max
            if self.una > self.rtt_seq:
                if self.mdev_max < self.rttvar:
                    self.rttvar -= (self.rttvar - self.mdev_max) >> 2
                self.rtt_seq = self.nxt
                self.mdev_max = rto_min
        self.rto = (self.srtt8 >> 3) + self.rttvar

    def _hystart_update(self, delay: VirtualTime) -> None:
        """HyStart (tcp_cubic.c): leave slow start on an ACK train of half the minimum RTT, or on a rise
        of the round's minimum RTT by max(4 ms, min(16 ms, RTT/8))."""
        now = self.net.kernel.now
        if self.una > self.end_seq:
            self.round_start = self.last_ack = now
            self.end_seq = self.nxt
            self.curr_rtt = None
            self.sample_cnt = 0
        if self.cwnd < 16:  # hystart_low_window, checked after the round reset (Linux 6.14, 25c1a9ca53db)
            return
        if self.net.tcp.hystart_ack_train and now - self.last_ack <= 2_000_000:
            self.last_ack = now
            rate = self.pacing_rate()
            ack_delay = min(1_000_000, self.net.tcp.gso_max_bytes * 4 * NS_PER_S // rate) if rate else 0
            if now - self.round_start > (self.delay_min + ack_delay) >> 1:
                self.found = True
                self.ssthresh = self.cwnd
                return
        if not self.net.tcp.hystart_delay:
            return
        if self.curr_rtt is None or self.curr_rtt > delay:
            self.curr_rtt = delay
        if self.sample_cnt < 8:
            self.sample_cnt += 1
        elif self.curr_rtt > self.delay_min + min(max(self.delay_min >> 3, 4_000_000), 16_000_000):
            self.found = True
            self.ssthresh = self.cwnd

    def _cubic_update(self, acked: int) -> None:
        """bictcp_update without a loss: the cubic curve from the current cwnd, at most 5 % per RTT,
        never slower than Reno (TCP friendliness)."""
        hz = self.net.tcp.clock_hz
        jt = self.net.jiffies(self.net.kernel.now)
        cwnd = self.cwnd
        self.ack_cnt += acked
        if self.last_cwnd == cwnd and jt - self.last_time <= hz // 32:
            return
        if not (self.epoch_start is not None and jt == self.last_time):
            self.last_cwnd, self.last_time = cwnd, jt
            if self.epoch_start is None:
                self.epoch_start, self.ack_cnt, self.tcp_cwnd, self.origin = jt, acked, cwnd, cwnd
            t_s = (jt - self.epoch_start) / hz + (self.delay_min or 0) / NS_PER_S
            target = self.origin + int(0.4 * t_s ** 3)  # C = 0.4 segments/s^3, W_max = 0
            self.cnt = min(cwnd // (target - cwnd) if target > cwnd else 100 * cwnd, 20)
        delta = (cwnd * 15) >> 3  # beta_scale of beta = 717/1024
        while delta and self.ack_cnt > delta:
            self.ack_cnt -= delta
            self.tcp_cwnd += 1
        if self.tcp_cwnd > cwnd:
            self.cnt = min(self.cnt, cwnd // (self.tcp_cwnd - cwnd))
        self.cnt = max(self.cnt, 2)


class TcpNetwork:
    """The NIC, switch-port and TCP state of one agent's vworkers, and their events."""

    def __init__(self, kernel: Kernel, spec: NetworkSpec, env: "Environment"):
        if spec.tcp is None:
            raise ValueError("TcpNetwork needs NetworkSpec.tcp")
        self.kernel, self.spec, self.env, self.tcp = kernel, spec, env, spec.tcp
        self._hosts: dict[int, _Host] = {}
        self._ns_per_jiffy = NS_PER_S // self.tcp.clock_hz
        kernel.on_remote("tcp.pkt", self._on_port, self._port_effect)
        kernel.on_remote("notify", self._on_notify)

    # ------------------------------------------------------------ helpers
    def jiffies(self, t: VirtualTime) -> int:
        return t // self._ns_per_jiffy

    def rto_jiffies(self, rto: VirtualTime) -> int:
        return max(1, -(-rto // self._ns_per_jiffy))

    def _host(self, vid: int) -> _Host:
        h = self._hosts.get(vid)
        if h is None:
            rate_out, rate_in = self.spec.bandwidth_out[vid], self.spec.bandwidth_in[vid]
            burst = _ser(self.tcp.nic_burst_bytes, rate_out)
            h = self._hosts[vid] = _Host(self.kernel.workers[vid], rate_out, rate_in, burst)
        return h

    def host_rtt(self, sender: int, receiver: int) -> VirtualTime:
        """The hosts' constant share of the round trip of the connection ``sender`` -> ``receiver``: a keyed
        uniform draw in [host_rtt_min, host_rtt_max], the same on every agent (the ACK's poster needs it)."""
        s = self.tcp
        return s.host_rtt_min_ns + int((s.host_rtt_max_ns - s.host_rtt_min_ns)
                                       * keyed.uniform(self.env.seed, "host_rtt", sender, receiver))

    def _latency(self, src: int, dst: int, seq: int) -> VirtualTime:
        return self.spec.latency.sample(src, dst, seq)

    def _small_rtt(self, src: int, dst: int, rtt0: VirtualTime) -> VirtualTime | None:
        """The round trip of a one-segment message and its ACK on an idle path (``small_messages_first``)."""
        if not self.tcp.small_messages_first:
            return None
        data, ack = wire_bytes(self.tcp, 1), self.tcp.header_bytes + self.tcp.frame_bytes
        sp = self.spec
        return (rtt0 + _ser(data, sp.bandwidth_out[src]) + _ser(data, sp.bandwidth_in[dst])
                + _ser(ack, sp.bandwidth_out[dst]) + _ser(ack, sp.bandwidth_in[src]))

    # ------------------------------------------------------------- sender
    def send(self, w: "Worker", dst: int, payload: Any, nbytes: int | None, tag: Any) -> SendHandle:
        size = payload_nbytes(payload) if nbytes is None else int(nbytes)
        if size < 0:
            raise ValueError(f"{w.name}: send with negative nbytes {size}")
        if dst == w.id:
            raise ValueError(f"{w.name}: send to itself")
        k = self.kernel
        w.msg_seq += 1
        host = self._host(w.id)
        snd = host.senders.get(dst)
        if snd is None:
            rtt0 = max(1, self._latency(w.id, dst, w.msg_seq) + self._latency(dst, w.id, w.msg_seq))
            snd = host.senders[dst] = _Sender(self, host, dst, rtt0, self._small_rtt(w.id, dst, rtt0))
        handle = SendHandle(k, None)
        msg = _Msg(0, w.name, self.env.names[dst], w.msg_seq, tag, payload, size, k.now, handle)
        msg.latency = self._latency(w.id, dst, w.msg_seq)
        tr = Transfer(w.id, dst, w.name, self.env.names[dst], w.msg_seq, tag, payload, size, k.now, k.now,
                      msg.latency, None, host.rate_out)
        self.env.on_send(w, tr, remote=not k.is_local(dst))
        snd.write(msg, max(size, 1))  # an empty message still needs a segment
        return handle

    def enqueue(self, host: _Host, pkt: _Packet) -> None:
        host.queue.append(pkt)
        if not host.busy:
            host.busy = True
            self._serve(host)

    def _serve(self, host: _Host) -> None:
        """The token bucket releases the head packet once it holds the packet's line time."""
        k = self.kernel
        now = k.now
        if not host.queue:
            host.busy = False
            return
        pkt = host.queue[0]
        credit = min(host.credit + (now - host.credit_t), host.burst_ns)
        host.credit, host.credit_t = credit, now
        ser = _ser(pkt.wire, host.rate_out)
        if credit < ser:
            k.schedule(now + (ser - credit), PRIO_NET, host.worker, self._serve, host)
            return
        host.queue.popleft()
        host.credit = credit - ser
        pkt.e_done = host.egress_free = max(now, host.egress_free) + ser
        msgs = pkt.msgs
        latency = msgs[-1].latency if msgs else self._latency(pkt.src, pkt.dst, 0)
        ser_in = _ser(pkt.wire, self.spec.bandwidth_in[pkt.dst])
        # what crosses to the receiver's agent: plain values (agents/common/wire.py)
        carried = tuple((m.seq, m.src_name, m.dst_name, m.tag, m.payload, m.nbytes, m.sent_at,
                         m.first_out if m.first_out is not None else m.sent_at, m.latency) for m in msgs)
        data = (pkt.src, pkt.dst, pkt.ack, pkt.end, pkt.tsent, pkt.e_done, latency, ser_in, carried)
        k.post(now + latency, PRIO_NET, host.worker, pkt.dst, "tcp.pkt", data, self._port_effect(data, now + latency))
        if not pkt.ack:
            snd = host.senders[pkt.dst]
            snd.qdisc_bytes -= pkt.truesize
            for m in msgs:
                k.schedule(pkt.e_done, PRIO_NET, host.worker, _complete, (m.handle, pkt.e_done))
            snd.try_send()
        k.schedule(now, PRIO_NET, host.worker, self._serve, host)

    # ---------------------------------------------------------- receiver
    def _port_effect(self, data: tuple, t: VirtualTime) -> VirtualTime:
        """The earliest time a packet announced to its receiver's port at ``t`` can make anything happen:
        its last bit's arrival, and for an ACK the hosts' share of the round trip after it (what
        :meth:`_on_port` adds before the sender acts on it)."""
        src, dst, ack, end, _, e_done, latency = data[:7]
        acts = e_done + latency
        if ack:
            acts += self.host_rtt(dst, src) + self._ack_jitter(src, dst, end)
        return acts if acts > t else t

    def _on_port(self, data: tuple) -> None:
        """A packet reached its receiver's switch port: serialised there in arrival order. An ACK is acted on
        the hosts' share of the round trip later, a data packet arrives in its connection's byte order."""
        src, dst, ack, end, tsent, e_done, latency, ser_in, msgs = data
        host = self._host(dst)
        release = max(e_done + latency, host.port_free + ser_in)
        host.port_free = release
        if ack:
            snd = host.senders[src]
            release = max(release + snd.host_rtt + self._ack_jitter(src, dst, end), snd.ack_ready)
            snd.ack_ready = release
        else:
            rcv = host.receivers.get(src)
            if rcv is None:
                rcv = host.receivers[src] = _Receiver()
            release = max(release, rcv.last_release)  # a connection's bytes arrive in order
            rcv.last_release = release
        self.kernel.schedule(release, PRIO_NET, host.worker, self._arrive, data)

    def _arrive(self, data: tuple) -> None:
        src, dst, ack, end, tsent, e_done, latency, ser_in, msgs = data
        host = self._hosts[dst]
        if ack:
            host.senders[src].on_ack(end, tsent)
            return
        rcv = host.receivers[src]
        start = rcv.rcv_nxt
        rcv.rcv_nxt = end
        now = self.kernel.now
        for m in msgs:
            self.kernel.schedule(now + self._host_delay(src, dst, m[0]), PRIO_NET, host.worker,
                                 self._deliver, (src, dst, m, now))
        if not self.tcp.delayed_ack:  # one ACK per packet
            self.enqueue(host, _Packet(dst, src, True, end, end, 0, tsent, self.tcp.header_bytes + self.tcp.frame_bytes))
            return
        self._ack_policy(host, src, rcv, end - start, tsent)

    # ------------------------------------------------- the receiver's ACKs
    def _ack_policy(self, host: _Host, src: int, rcv: _Receiver, length: int, tsent: VirtualTime) -> None:
        """When Linux's receiver acknowledges a data packet (``delayed_ack``; tcp_input.c):

        * at once when more than one full segment is unacknowledged (``__tcp_ack_snd_check``), or while
          quick ACKs last — 16 of them after the first data and after a gap longer than the RTO
          (``tcp_event_data_recv``);
        * a packet shorter than a segment when the application reads it, ``host_latency`` later
          (``ICSK_ACK_PUSHED``, ``__tcp_cleanup_rbuf``); in pingpong mode (the host answered within
          ``delack`` of receiving) only the second such packet (``ICSK_ACK_PUSHED2``);
        * else after the delayed-ACK timer (``delack``, which also ends pingpong mode), or with data the
          host sends the peer first.
        """
        now, s = self.kernel.now, self.tcp
        if rcv.lrcv is None or now - rcv.lrcv > s.rto_min_ns:
            rcv.quick = QUICKACKS
        rcv.lrcv = now
        if rcv.tsent is None:
            rcv.tsent = tsent
        rcv.tlast = tsent
        if rcv.rcv_nxt - rcv.wup > s.mss or (rcv.quick > 0 and not rcv.pingpong):
            self.send_ack(host, src, rcv)
            return
        if length < s.mss:
            rcv.pushed += 1
        if rcv.pushed >= 2 or (rcv.pushed and not rcv.pingpong):  # read by the application: __tcp_cleanup_rbuf
            self._ack_at(host, src, rcv, now + s.host_latency_ns)
        else:
            self._ack_at(host, src, rcv, now + s.delack_ns, delayed=True)

    def _ack_at(self, host: _Host, src: int, rcv: _Receiver, t: VirtualTime, delayed: bool = False) -> None:
        if rcv.timer is not None:
            if rcv.timer_at <= t:
                return
            rcv.timer.cancel()
        rcv.timer_at = t
        rcv.timer = self.kernel.timer(t, PRIO_NET, host.worker, _AckTimer(self, host, src, rcv, delayed))

    def send_ack(self, host: _Host, src: int, rcv: _Receiver) -> None:
        """``host`` acknowledges everything it received from ``src``."""
        if rcv.timer is not None:
            rcv.timer.cancel()
            rcv.timer = None
        if rcv.quick > 0:
            rcv.quick -= 1
        rcv.pushed = 0
        rcv.wup = rcv.rcv_nxt
        tsent, rcv.tsent = (rcv.tsent, rcv.tlast), None
        self.enqueue(host, _Packet(host.worker.id, src, True, rcv.rcv_nxt, rcv.rcv_nxt, 0, tsent,
                                   self.tcp.header_bytes + self.tcp.frame_bytes))

    def _ack_jitter(self, src: int, dst: int, end: int) -> VirtualTime:
        """The keyed exponential part of the hosts' share of a round trip (mean ``ack_delay``), drawn per ACK:
        ``(seed, "ack", the ACK's sender, its receiver, the byte it acknowledges up to)``."""
        if not self.tcp.ack_delay_ns:
            return 0
        u = keyed.uniform(self.env.seed, "ack", src, dst, end)
        return int(-self.tcp.ack_delay_ns * math.log1p(-u))

    def _host_delay(self, src: int, dst: int, seq: int) -> VirtualTime:
        s = self.tcp
        if not s.host_jitter_ns:
            return s.host_latency_ns
        u = keyed.uniform(self.env.seed, "host", src, dst, seq)
        return s.host_latency_ns + int(round(-s.host_jitter_ns * math.log1p(-u)))

    def _deliver(self, item: tuple) -> None:
        src, dst, m, arrived = item
        seq, src_name, dst_name, tag, payload, nbytes, sent_at, first_out, latency = m
        now = self.kernel.now
        msg = Message(src_name, dst_name, tag, payload, nbytes, sent_at, seq)
        msg.delivered_at = now
        tr = Transfer(src, dst, src_name, dst_name, seq, tag, payload, nbytes, sent_at, first_out, latency,
                      arrived, 0.0)
        self.env.deliver(self.kernel.workers[dst], msg, tr, now)

    # ------------------------------------------------------- history
    def barrier_history(self, w: "Worker", heard: list[int], answered: set[int]) -> None:
        """The receiver state a barrier before the first tensor leaves (``delayed_ack`` only; gloo's
        dissemination barrier, :func:`agents.strategies.collective.gloo_barrier`): ``w`` received a
        short message from every peer in ``heard`` just now (the first data of the connection: its quick
        ACKs granted, one spent acknowledging it) and answered those in ``answered`` within the
        delayed-ACK time (pingpong mode, ``tcp_event_data_sent``)."""
        if not self.tcp.delayed_ack:
            return
        host, now = self._host(w.id), self.kernel.now
        for src in heard:
            rcv = host.receivers.get(src)
            if rcv is None:
                rcv = host.receivers[src] = _Receiver()
            rcv.lrcv = now
            rcv.quick = QUICKACKS - 1
            rcv.pingpong = src in answered

    # ------------------------------------------------------------- notify
    def notify(self, w: "Worker", owner: int, name: str) -> None:
        if owner == w.id:
            w.ring(name)
            return
        w.msg_seq += 1
        lat = self._latency(w.id, owner, w.msg_seq)
        self.kernel.post(self.kernel.now + lat, PRIO_NET, w, owner, "notify", (owner, name))

    def _on_notify(self, data: tuple[int, str]) -> None:
        owner, name = data
        self.kernel.workers[owner].ring(name)


def _sndbuf(spec: TcpSpec, cwnd: int, sndbuf: int) -> int:
    """tcp_sndbuf_expand: room for twice the window at ``per_mss`` bytes a segment — the segment with
    MAX_TCP_HEADER (192) and skb_shared_info (320) rounded up to a power of two, plus an sk_buff (256): 2 304
    bytes for an MSS of 1 448, as the testbed's sockets report (sndbuf 2 419 200 = 2 × 525 × 2 304)."""
    per_mss = (1 << (spec.mss + 192 + 320 - 1).bit_length()) + 256
    return max(sndbuf, min(2 * max(cwnd, spec.initial_window) * per_mss, spec.wmem_max_bytes))


def _ser(nbytes: int, rate: float) -> VirtualTime:
    """Line time of ``nbytes`` at ``rate`` bytes/s, in integer ns (rounded up: a bit takes its whole slot)."""
    if math.isinf(rate):
        return 0
    return int(math.ceil(nbytes * NS_PER_S / rate))


def _complete(item: tuple[SendHandle, VirtualTime]) -> None:
    handle, t = item
    handle.complete(t)
