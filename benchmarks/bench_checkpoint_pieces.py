"""A checkpoint's way from an agent process to the controller's files and back, piece by piece
(docs/benchmarks.md, "Checkpoints at 10 000 vworkers on agents", "Restoring the agents side by side"): the agent's
side — its pieces made into the frames gRPC sends —, the controller's — each frame parsed, decoded and kept —, a
restore's — the file made into the frames for the agent — and the agent taking those frames, as they are now, against the code before them (kept below as the baseline),
each variant in a fresh process.

* agent, before: ``checkpoint_reply`` built every frame message first (``bytes(piece)``, the message, its
  ``ByteSize``), then gRPC serialized each (``SerializeToString``).
* agent, now: ``checkpoint_reply`` yields each frame's bytes as it is taken (``wire.reply_bytes``: one copy);
  gRPC sends them as they are (``wire.serialize_frame``).
* controller, before: every piece held until the agent's last (then written by the commit).
* controller, now: each piece written to the agent's file as it comes (``CheckpointStore.stage``).
* restore, before: the controller read the agent's file whole, sliced it into pieces and made every frame
  (``ByteSize`` included), all queued for the stream, which serialized each.
* restore, now: the file read a piece at a time, each frame serialized around its piece
  (``Checkpoint.agent_pieces``, ``wire.append_bytes``); the stream sends the bytes as they are.
* taking, before: the agent takes a restore's frames as gRPC hands them over (fresh bytes each), parses each,
  decodes its piece and appends it to the buffer that gathers them, then copies every storage out of that buffer
  into a tensor of its own (``AgentProcess._restore`` of b4a0546, up to the unpickling), every copy in its own
  mapping when the agent is compact. The checkpoint here is a core of 640 KiB storages (an MLP's parameters).
* taking, now: ``agents.core.passing_buffers`` on while the pieces come (the copies reuse the heap's pages), and
  each piece fed to ``agents.checkpoint.Taking``, which writes each storage's bytes straight into its tensor.

Every side runs on the same Blob (PIECES of PIECE_MB MiB of random bytes, views, as a snapshot's storages),
with glibc's mmap threshold fixed at 128 KiB as a compact agent has it (``memory=auto`` from 1 000 vworkers:
each 4 MiB buffer is then fresh pages), and once without (``--default-malloc``). Printed per variant: the
best wall time of REPEATS, CPU time, and how far the timed part raised the process's peak resident set (the
Blob, and for the restore the file, were made before it).
usage: python benchmarks/bench_checkpoint_pieces.py [PIECES] [PIECE_MB] [REPEATS] [--default-malloc]
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile

from _common import ROOT, load_average

_CHILD = r"""
import ctypes, json, resource, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, %(root)r)
variant, pieces, piece_mb, compact = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
if compact:
    ctypes.CDLL("libc.so.6").mallopt(-3, 131072)  # M_MMAP_THRESHOLD, as agents.core.use_memory does
import numpy as np
from agents import mesh
from agents.common import wire
from agents.common.files import Blob, headed
from controller import checkpoints
from controller.checkpoints import CheckpointStore, Checkpointer
from protos.lockstep.v1 import agent_pb2 as pb

checkpoints._sync = lambda path: None  # the CPU's part of the way, not the disk's

n = piece_mb << 20
whole = memoryview(np.random.default_rng(0).integers(0, 256, pieces * n, dtype=np.uint8))
blob = headed({"format": 2}, [whole[i * n:(i + 1) * n] for i in range(pieces)])
writer = wire.FrameWriter(pb.AgentFrame, 16 << 20)

def reply_before(writer, call_id, status, window, blob):  # agents/mesh.py checkpoint_reply of 5f23156
    frames = []
    step = mesh.piece_bytes(writer)
    pieces = blob.chunks(step) or [b""]
    for i, piece in enumerate(pieces):
        f = pb.AgentFrame()
        f.reply.id = call_id
        wire.encode_value((status, window, i, len(pieces), bytes(piece)), f.reply.value)
        frames.extend(writer.frames(f))
    return frames

sent = list(mesh.checkpoint_reply(writer, 1, "ok", 5, blob)) if variant.startswith("controller") else None
if variant.startswith("taking"):  # the frames a restore sends (controller/run.py _RestoreStream.send_next)
    import contextlib
    from agents import checkpoint
    from agents.core import passing_buffers
    size = 640 << 10
    table = [(("cpu", 0, i), i * size, size) for i in range(len(whole) // size)]
    core = headed({"format": 2, "storages": table, "graph": 0}, [whole[:len(table) * size]])
    data = mesh.pack_checkpoint(5, {}, core).tobytes()
    step = mesh.piece_bytes(wire.FrameWriter(pb.ControllerFrame, 16 << 20))
    parts = max(1, -(-len(data) // step))
    received = []
    for i in range(parts):
        f = pb.ControllerFrame()
        f.call.id, f.call.method = i + 1, "restore"
        wire.encode_value((i, parts), f.call.args)
        received.append(wire.append_bytes(f, ("call", "args"), memoryview(data)[i * step:(i + 1) * step]))
    del blob, whole, data
if variant.startswith("restore"):
    ckdir = tempfile.TemporaryDirectory()
    CheckpointStore(Path(ckdir.name), "{}").commit(5, 0, {0: blob}, {}, {})
    del blob, whole  # a restarted controller has only the file
    ck = CheckpointStore(Path(ckdir.name), "{}").latest()
    cwriter = wire.FrameWriter(pb.ControllerFrame, 16 << 20)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
c0, t0 = time.process_time(), time.perf_counter()
if variant == "agent before":
    for f in reply_before(writer, 1, "ok", 5, blob):
        f.SerializeToString()  # what gRPC's serializer does with each
elif variant == "agent now":
    for f in mesh.checkpoint_reply(writer, 1, "ok", 5, blob):
        wire.serialize_frame(f)
elif variant == "restore before":  # controller/run.py restore_agents of 5f23156, and gRPC's serializer
    data = ck.agent_blob(0)
    step = mesh.piece_bytes(cwriter)
    pieces = [data[i:i + step] for i in range(0, len(data), step)] or [b""]
    queued = []
    for i, piece in enumerate(pieces):
        f = pb.ControllerFrame()
        f.call.id, f.call.method = i + 1, "restore"
        wire.encode_value((i, len(pieces), piece), f.call.args)
        queued.extend(cwriter.frames(f))
    for f in queued:
        f.SerializeToString()
elif variant == "restore now":
    step = mesh.piece_bytes(cwriter)
    parts = ck.agent_parts(0, step)
    for i, piece in enumerate(ck.agent_pieces(0, step)):
        f = pb.ControllerFrame()
        f.call.id, f.call.method = i + 1, "restore"
        wire.encode_value((i, parts), f.call.args)
        wire.serialize_frame(wire.append_bytes(f, ("call", "args"), piece))
elif variant.startswith("taking"):  # agents/agent.py AgentProcess._restore, up to the unpickling
    now = variant == "taking now"

    @contextlib.contextmanager
    def compact_meanwhile():  # AgentProcess._compact_meanwhile
        passing_buffers(False)
        yield
        passing_buffers(True)

    if now:
        passing_buffers(True)
        taking = checkpoint.Taking(compact_meanwhile)
    else:
        buf = bytearray()
    for raw in received:
        got = bytes(raw)  # gRPC hands each message over as fresh bytes
        call = pb.ControllerFrame.FromString(got).call
        del got
        part, parts, piece = wire.decode_value(call.args)
        del call
        if now:
            taking.feed(piece)
        else:
            buf += piece
        del piece
    if now:
        passing_buffers(False)
        taking.done()
        storages = taking.storages
    else:
        head, graph, region = checkpoint._parts(mesh.unpack_checkpoint(buf)["core"])
        storages = checkpoint._storages(head["storages"], region)
        del head, graph, region, buf
    assert len(storages) == len(table)
else:
    with tempfile.TemporaryDirectory() as d:
        store = CheckpointStore(Path(d), "{}")
        ck = Checkpointer(1e-9, lambda k, blobs, view: store.commit(k, 0, blobs, view, {}),
                          stage=store.stage if variant == "controller now" else None)
        ck.asked(5, {0: 1})
        for raw in sent:
            ck.answer(0, wire.decode_value(pb.AgentFrame.FromString(raw).reply.value))
        ck.finish({})
t = time.perf_counter() - t0
print(json.dumps({"wall_s": t, "cpu_s": time.process_time() - c0,
                  "peak_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024}))
"""


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    pieces = int(args[0]) if args else 64
    piece_mb = int(args[1]) if len(args) > 1 else 8
    repeats = int(args[2]) if len(args) > 2 else 3
    compact = "0" if "--default-malloc" in sys.argv else "1"
    gb = pieces * piece_mb / 1024
    print(f"bench_checkpoint_pieces: {pieces} pieces of {piece_mb} MiB ({gb:.2f} GiB), "
          f"{'compact (mmap threshold 128 KiB)' if compact == '1' else 'default'} malloc, best of {repeats}; "
          f"load average {load_average()}", flush=True)
    variants = ["agent before", "agent now", "controller before", "controller now", "restore before", "restore now",
                "taking before", "taking now"]
    got: dict[str, list[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory():
        for _ in range(repeats):
            for v in variants:
                out = subprocess.run([sys.executable, "-c", _CHILD % {"root": str(ROOT)}, v, str(pieces),
                                      str(piece_mb), compact], capture_output=True, text=True, check=True)
                got[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
    best = {v: min(r["wall_s"] for r in rs) for v, rs in got.items()}
    for v in variants:
        rs = got[v]
        print(f"{v:18s} {best[v]:7.2f} s ({best[v] / gb:5.2f} s per GiB)  CPU {min(r['cpu_s'] for r in rs):6.2f} s  "
              f"peak +{max(r['peak_mb'] for r in rs):7.0f} MB")
    for side in ("agent", "controller", "restore", "taking"):
        print(f"{side}: now {best[f'{side} before'] / best[f'{side} now']:.2f}x faster than before")


if __name__ == "__main__":
    main()
