"""What one direct-window report costs an agent's window thread, against the bare socket calls it needs.

In one process, over a Unix socket pair (what two agents on one host use, agents/mesh.py):

* ``receive``: a report of the default experiment's usual shape (no events, one routing entry) is already
  in the socket; ``MeshLinks.exchange`` takes it — the selector, the read, the frame's checks, the
  protobuf parse. Baseline: one ``recv`` of the same bytes.
* ``send``: ``MeshLinks.exchange`` sends one such frame. Baseline: one ``send`` of the same bytes.
* ``ack packet``: a tcp ACK packet crossing agents (a ``tcp.pkt`` event, agents/sim/tcp.py) encoded into an
  ``Event`` and decoded from it (agents/common/wire.py). No baseline: the two figures are absolute.
* ``state-log record``: one ``state.version`` record (a row key, names and a dict) on its way from an agent
  to the controller, encoded and decoded (per record of a list of 50). Absolute.
* ``checkpoint piece``: one 4 MiB piece of an agent's checkpoint as the controller receives it (its
  ``AgentFrame`` parsed, then its value decoded, agents/mesh.py ``checkpoint_reply``). Absolute, in ms.
* ``keyed draw``: one ``keyed.uniform`` with the key of an ACK's jitter (agents/sim/keyed.py), drawn per
  packet on the tcp network. Absolute.

Each figure is the mean of N calls, best of 3; the ratio is lockstep's cost over the bare call.
usage: python benchmarks/bench_mesh_frames.py [N]   (docs/benchmarks.md, "Cheaper windows on the tcp network")
"""
from __future__ import annotations

import socket
import sys
import time

from _common import load_average  # also puts the repository on sys.path

from agents import mesh
from agents.common import wire
from agents.sim import keyed
from agents.sim.kernel import RemoteEvent
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import mesh_pb2 as mpb


def _best(fn, n: int) -> float:
    """Mean µs per call of ``fn(n)`` (which times its own n calls and returns ns), best of 3."""
    return min(fn(n) for _ in range(3)) / n / 1e3


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    rep = mpb.MeshReport(window=12345, next_time=4_000_000_123, horizon=4_000_100_000)
    rep.routed.add(agent=0, count=1, min_time=4_000_000_500, min_effect=4_000_100_000)
    body = rep.SerializeToString()
    frame = mesh._PREFIX.pack(len(body), 0) + body
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    x, y = mesh.MeshLinks(0, {1: b}), mesh.MeshLinks(1, {0: a})
    c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def receive(k: int) -> int:
        t = 0
        for _ in range(k):
            a.send(frame)
            t0 = time.perf_counter_ns()
            x.exchange({}, {1})
            t += time.perf_counter_ns() - t0
        return t

    def receive_bare(k: int) -> int:
        t = 0
        for _ in range(k):
            c.send(frame)
            t0 = time.perf_counter_ns()
            d.recv(1 << 16)
            t += time.perf_counter_ns() - t0
        return t

    def send(k: int) -> int:
        t = 0
        for _ in range(k):
            t0 = time.perf_counter_ns()
            y.exchange({0: [frame]}, set())
            t += time.perf_counter_ns() - t0
            b.recv(1 << 16)
        return t

    def send_bare(k: int) -> int:
        t = 0
        for _ in range(k):
            t0 = time.perf_counter_ns()
            c.send(frame)
            t += time.perf_counter_ns() - t0
            d.recv(1 << 16)
        return t

    data = (3, 0, True, 123456, (4_000_000_000, 4_000_100_000), 4_000_200_000, 100_000, 524, ())
    ack = RemoteEvent(4_000_300_000, 2, 3, 17, 0, "tcp.pkt", data, 4_000_500_000)
    e = wire.encode_event(ack, pb.Event())

    def encode(k: int) -> int:
        t0 = time.perf_counter_ns()
        for _ in range(k):
            wire.encode_event(ack, pb.Event())
        return time.perf_counter_ns() - t0

    def decode(k: int) -> int:
        t0 = time.perf_counter_ns()
        for _ in range(k):
            wire.decode_event(e)
        return time.perf_counter_ns() - t0

    records = [((4_000_000_000, 17, 3), "state.version", "ps0", {"version": 1234, "crc": 987654321})] * 50
    v = wire.encode_value(records, pb.Value())

    def encode_records(k: int) -> int:
        t0 = time.perf_counter_ns()
        for _ in range(k // 50):
            wire.encode_value(records, pb.Value())
        return time.perf_counter_ns() - t0

    def decode_records(k: int) -> int:
        t0 = time.perf_counter_ns()
        for _ in range(k // 50):
            wire.decode_value(v)
        return time.perf_counter_ns() - t0

    def draw(k: int) -> int:
        t0 = time.perf_counter_ns()
        for end in range(k):
            keyed.uniform(3, "ack", 1, 0, end)
        return time.perf_counter_ns() - t0

    piece = pb.AgentFrame()
    piece.reply.id = 1
    wire.encode_value(("ok", 5, 0, 10, bytes(mesh.piece_bytes(wire.FrameWriter(pb.AgentFrame)))), piece.reply.value)
    piece_bytes = piece.SerializeToString()
    pieces = max(1, n // 400)

    def parse_piece(k: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(k):
            pb.AgentFrame.FromString(piece_bytes)
        return (time.perf_counter_ns() - t0) / k / 1e6

    parsed = pb.AgentFrame.FromString(piece_bytes)

    def decode_piece(k: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(k):
            wire.decode_value(parsed.reply.value)
        return (time.perf_counter_ns() - t0) / k / 1e6

    print(f"bench_mesh_frames: {n} calls, best of 3, a {len(frame)}-byte report, load average {load_average()}")
    for what, ours, bare in (("receive", receive, receive_bare), ("send", send, send_bare)):
        o, r = _best(ours, n), _best(bare, n)
        print(f"  {what}: exchange {o:.1f} us, bare {r:.1f} us: ratio {o / r:.2f}")
    print(f"  ack packet: encode {_best(encode, n):.1f} us, decode {_best(decode, n):.1f} us "
          f"({e.ByteSize()} bytes)")
    print(f"  state-log record: encode {_best(encode_records, n):.1f} us, decode {_best(decode_records, n):.1f} us")
    print(f"  keyed draw: {_best(draw, n):.2f} us")
    print(f"  checkpoint piece ({len(piece_bytes) / 2**20:.1f} MiB, {pieces} calls, best of 3): parse "
          f"{min(parse_piece(pieces) for _ in range(3)):.2f} ms, decode {min(decode_piece(pieces) for _ in range(3)):.2f} ms")


if __name__ == "__main__":
    main()
