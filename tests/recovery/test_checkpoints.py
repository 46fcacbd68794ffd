"""Checkpoints (docs/recovery.md, "Checkpoints"): a lost agent or a lost controller restarts the run from the
latest coordinated checkpoint instead of from virtual time 0, and the run still ends with the outputs of an
undisturbed one — metrics.csv, eval.csv (but their wall_* columns), params.pt, statelog.jsonl and trace.json.

Real processes, real SIGKILL, real gRPC on 127.0.0.1 (launcher=local, direct windows, the default);
the run directory's ``checkpoints/latest`` says when a checkpoint is committed (polled, never slept on).
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import pickle
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from agents.common.files import Blob
from controller.checkpoints import FIRST_SLACK, REFUSALS_BEFORE_GIVING_UP, CheckpointStore, Checkpointer, \
    CheckpointUnusable
from tests.distributed.conftest import ROOT, assert_same_outputs
from tests.helpers import agent_pids, alive, wait_until

# ~3 000 rows in ~15 s on the 2-core VM; a checkpoint every 0.5 wall s, so several come before any kill
RUN = ["workers=8", "agents=2", "model=mlp", "compute=constant", "stop.updates=3000", "eval.every=500",
       "progress=false", "launcher=local", "controller.heartbeat_s=0.5", "network.latency=1ms"]
OFTEN = ["recovery.checkpoint_every_s=0.5"]
WALL = ("wall_time_s", "wall_compute_s", "wall_barrier_s", "wall_cpu_s", "speed_ratio", "peak_memory", "recovery",
        "run_id", "config_hash")


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "controller.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return out


def _rows(run_dir: Path) -> int:
    try:
        return max(0, len((run_dir / "metrics.csv").read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def _committed(run_dir: Path) -> dict | None:
    """The manifest of the latest committed checkpoint, once there is one."""
    try:
        k = (run_dir / "checkpoints" / "latest").read_text().strip()
        return json.loads((run_dir / "checkpoints" / k / "manifest.json").read_text())
    except (OSError, ValueError):
        return None


def _summary(run_dir: Path) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    s["compute_batch"].pop("overlap_wait_s", None)
    return {k: v for k, v in s.items() if k not in WALL}


def _trace(run_dir: Path) -> dict:
    t = json.loads((run_dir / "trace.json").read_text())
    t["otherData"].pop("run_id")
    return t


def assert_identical(undisturbed: Path, recovered: Path, summary: bool = True) -> None:
    """Every output of the run the same (the runs' controller settings may differ: not their results)."""
    assert_same_outputs(undisturbed, recovered)
    assert (recovered / "statelog.jsonl").read_bytes() == (undisturbed / "statelog.jsonl").read_bytes()
    assert _trace(recovered) == _trace(undisturbed)
    if summary:
        assert _summary(recovered) == _summary(undisturbed)


def _events(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "recovery.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> Path:
    """The reference: no checkpoint at all (recovery.checkpoint_every_s=0)."""
    d = tmp_path_factory.mktemp("undisturbed") / "run"
    out = _finish(_cli("run", *RUN, "recovery.checkpoint_every_s=0", f"hydra.run.dir={d}"))
    assert (d / "summary.json").exists(), out
    return d


def test_taking_checkpoints_changes_no_output_and_a_complete_run_deletes_them(tmp_path, undisturbed):
    d = tmp_path / "run"
    proc = _cli("run", *RUN, "recovery.checkpoint_every_s=0.2", f"hydra.run.dir={d}")
    out = _finish(proc)
    assert proc.returncode == 0, out
    assert json.loads((d / "summary.json").read_text())["recovery"]["checkpoints"] >= 3, out
    assert_identical(undisturbed, d)
    assert not (d / "checkpoints").exists(), "a complete run keeps no recovery data"


# compact: agents whose allocator is compact (memory=compact) take a restore's pieces, 32 KiB each here, through
# their heap (agents.core.passing_buffers) and are compact again for their cores' tensors
@pytest.mark.parametrize("windows", ["direct", "hub", "compact"])
def test_an_agent_killed_after_a_checkpoint_restarts_from_it_and_the_run_ends_as_if_nothing_happened(
        tmp_path, undisturbed, windows):
    d = tmp_path / "run"
    over = ["memory=compact", "controller.max_message_bytes=65536"] if windows == "compact" else \
        [f"controller.windows={windows}"]
    proc = _cli("run", *RUN, *OFTEN, *over, f"hydra.run.dir={d}")
    try:
        pids = agent_pids(d, 2, timeout=120)
        wait_until(lambda: _committed(d) and _rows(d) > 1000, timeout=120,
                   what="a committed checkpoint and 1000 rows of metrics.csv")
        os.kill(pids[1], signal.SIGKILL)
    finally:
        out = _finish(proc)
    assert proc.returncode == 0, out
    # named by the launcher (its process, SIGKILL) or, first, by the peer whose direct stream to it broke
    assert re.search(r"agent 1 was lost \(its process .*SIGKILL|agent 0 was lost \(reported an error: the direct "
                     r"stream to agent 1 broke", out), out
    events = _events(d)
    assert [e["event"] for e in events][:2] == ["restart", "restored"], events
    restored = events[1]
    assert restored["window"] > 0 and restored["rows_kept"] > 0, "restarted from a checkpoint, not from 0"
    assert f"restored from checkpoint {restored['window']} (virtual time" in out, out
    rec = json.loads((d / "summary.json").read_text())["recovery"]
    assert rec["agent_restarts"] == 1 and rec["restored_from_window"] == restored["window"]
    assert_identical(undisturbed, d)
    assert not any(alive(p) for p in pids)
    logs = [(d / "agents" / f"agent-{a}.log").read_text() for a in (0, 1)]
    for log in logs:
        taken = re.findall(rf"restored the checkpoint of window {restored['window']} \((\d+) pieces(, taken through "
                           r"the heap)?; peak resident set so far [0-9.]+ GB\)", log)
        assert len(taken) == 1, log
        if windows == "compact":
            assert int(taken[0][0]) > 1 and taken[0][1], log
        else:
            assert not taken[0][1], log


def _kill_controller_after_a_checkpoint(d: Path, sig: int = signal.SIGKILL) -> tuple[dict, bytes]:
    proc = _cli("run", *RUN, *OFTEN, f"hydra.run.dir={d}")
    try:
        pids = agent_pids(d, 2, timeout=120)
        manifest = wait_until(lambda: _rows(d) > 1200 and _committed(d), timeout=120,
                              what="1200 rows of metrics.csv and a committed checkpoint")
        proc.send_signal(sig)
    finally:
        out = _finish(proc, timeout=30)
    if sig != signal.SIGKILL:  # a graceful stop: outputs finalised up to its last window, not complete
        assert proc.returncode == 128 + sig and f"interrupted by {signal.Signals(sig).name}" in out, out
        assert not json.loads((d / "summary.json").read_text())["complete"]
    wait_until(lambda: not any(alive(p) for p in pids), timeout=120, what="the orphaned agents to exit")
    written = (d / "metrics.csv").read_bytes()
    return _committed(d) or manifest, written[: written.rfind(b"\n") + 1]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_controller_killed_after_a_checkpoint_is_resumed_from_it_with_identical_outputs(tmp_path, undisturbed, sig):
    # SIGTERM (a pod evicted) and SIGINT (Ctrl-C) once left the run resumable only from virtual time 0: the
    # graceful stop removed the trace's spool, whose bytes the checkpoint counts ("checkpoint_unusable")
    d = tmp_path / "run"
    manifest, whole = _kill_controller_after_a_checkpoint(d, sig)
    res = _cli("resume", str(d))
    out = _finish(res)
    assert res.returncode == 0, out
    assert "resuming the run from its latest checkpoint" in out, out
    assert f"restored from checkpoint {manifest['window']} (virtual time" in out, out
    assert_identical(undisturbed, d)
    assert (d / "metrics.csv").read_bytes().startswith(whole), "rows written before the crash must be kept"
    summary = json.loads((d / "summary.json").read_text())
    rec = summary["recovery"]
    assert (rec["resumes"], rec["restored_from_window"]) == (1, manifest["window"])
    assert not (d / "checkpoints").exists()
    # the resumed controller's final metrics count the rows on disk once and the windows before the checkpoint
    # (they started at zero: updates_total 470 beside summary.json's 2 000)
    prom = dict(line.rsplit(" ", 1) for line in (d / "metrics.prom").read_text().splitlines()
                if line.startswith(("lockstep_updates_total ", "lockstep_windows_total ")))
    assert float(prom["lockstep_updates_total"]) == summary["updates"]
    assert float(prom["lockstep_windows_total"]) >= summary["windows"]  # replayed windows count again


def test_an_in_process_run_killed_after_a_checkpoint_is_resumed_from_it_with_identical_outputs(tmp_path, undisturbed):
    """launcher=inprocess: the controller's own window loop takes the checkpoints, the resume restores the cores
    in its process — and the outputs are those of the run with agent processes (placement independence), its
    summary that of an undisturbed in-process run (how compute calls were batched depends on the processes)."""
    inproc = [r if r != "launcher=local" else "launcher=inprocess" for r in RUN]
    ref = tmp_path / "undisturbed"
    p = _cli("run", *inproc, "recovery.checkpoint_every_s=0", f"hydra.run.dir={ref}")
    out = _finish(p)
    assert p.returncode == 0, out
    assert_identical(undisturbed, ref, summary=False)
    d = tmp_path / "run"
    proc = _cli("run", *inproc, *OFTEN, f"hydra.run.dir={d}")
    try:
        wait_until(lambda: _rows(d) > 1200 and _committed(d), timeout=120,
                   what="1200 rows of metrics.csv and a committed checkpoint")
        proc.send_signal(signal.SIGKILL)
    finally:
        _finish(proc, timeout=30)
    manifest = _committed(d)
    res = _cli("resume", str(d))
    out = _finish(res)
    assert res.returncode == 0, out
    assert json.loads((d / "summary.json").read_text())["recovery"]["restored_from_window"] == manifest["window"] > 0
    assert [e["event"] for e in _events(d)][:2] == ["resume", "restored"]
    assert_identical(ref, d)


@pytest.mark.parametrize("damage", ["truncated", "plan"])
def test_a_damaged_checkpoint_costs_one_warning_and_a_replay_from_virtual_time_0(tmp_path, undisturbed, damage):
    d = tmp_path / "run"
    manifest, _ = _kill_controller_after_a_checkpoint(d)
    ck = d / "checkpoints" / str(manifest["window"])
    if damage == "truncated":
        blob = (ck / "agent-1.ckpt").read_bytes()
        (ck / "agent-1.ckpt").write_bytes(blob[: len(blob) // 2])
        why = "agent-1.ckpt is not the file its manifest.json describes"
    else:
        manifest["plan_sha256"] = "0" * 64
        (ck / "manifest.json").write_text(json.dumps(manifest))
        why = "was taken with another plan"
    res = _cli("resume", str(d))
    out = _finish(res)
    assert res.returncode == 0, out
    assert out.count("the latest checkpoint cannot be used") == 1 and why in out, out
    assert "resuming the run: replaying it to the" in out and "restored from checkpoint" not in out, out
    assert_identical(undisturbed, d)
    assert json.loads((d / "summary.json").read_text())["recovery"]["restored_from_window"] is None


def test_a_row_changed_before_the_checkpoint_is_found_at_resume_and_nothing_is_written(tmp_path):
    # the checkpoint counted the rows before it but did not check them: the changed row stayed in a "complete" run
    d = tmp_path / "run"
    _kill_controller_after_a_checkpoint(d)
    lines = (d / "metrics.csv").read_text().splitlines(keepends=True)
    cells = lines[10].split(",")
    cells[3] = "9999"  # row 10's iteration
    lines[10] = ",".join(cells)
    (d / "metrics.csv").write_text("".join(lines))
    before = (d / "metrics.csv").read_bytes()
    res = _cli("resume", str(d))
    out = _finish(res)
    assert res.returncode == 1, out
    assert out.count("the latest checkpoint cannot be used") == 1 and "metrics.csv's first" in out and \
        "rows are not those its checkpoint counted (changed after it was written)" in out, out
    assert "the replayed run differs from metrics.csv row 10 (columns iteration:" in out, out
    assert (d / "metrics.csv").read_bytes() == before


def test_a_row_changed_after_the_checkpoint_is_named_by_its_row_in_the_file_and_nothing_is_written(tmp_path):
    # the message counted the rows from the restore ("row 160" for the file's row 916 after 756 kept)
    d = tmp_path / "run"
    manifest, _ = _kill_controller_after_a_checkpoint(d)
    kept = manifest["outputs"]["metrics_rows"]
    with open(d / "metrics.csv", newline="") as f:
        rows = list(csv.reader(f))  # rows[0] is the header: rows[n] is the file's row n
    assert len(rows) - 1 > kept + 1, f"no row written after the checkpoint's {kept}"
    n = kept + (len(rows) - 1 - kept + 1) // 2  # one of the rows after it, not the first
    rows[n][rows[0].index("loss")] = "0.5"
    with open(d / "metrics.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    before = (d / "metrics.csv").read_bytes()
    res = _cli("resume", str(d))
    out = _finish(res)
    assert res.returncode == 1, out
    assert f"restored from checkpoint {manifest['window']} (virtual time" in out, out
    assert f"the replayed run differs from metrics.csv row {n} (columns loss: {rows[n]} on disk, " in out, out
    assert "replayed): the rows on disk are not those this run produces (the file was edited, or written by " \
        "another lockstep version or another configuration)" in out, out
    assert (d / "metrics.csv").read_bytes() == before


# --- the pieces, in this process -------------------------------------------------------------------------------
def test_the_store_commits_a_checkpoint_with_its_manifest_and_finds_it_again_verified(tmp_path):
    store = CheckpointStore(tmp_path, '{"plan": 1}')
    state = {"collector": {"rows": [1.5, 2]}, "outputs": {"metrics_rows": 7, "eval_rows": 1}}
    store.commit(10, 5_000, {0: b"a" * 100, 1: b"b" * 50}, state, {"checkpoints_taken": 1})
    store.commit(25, 9_000, {0: Blob([b"c" * 4, memoryview(b"c" * 6)]), 1: b"d" * 20}, state,
                 {"checkpoints_taken": 2})  # an in-process agent's checkpoint: a Blob, written piece by piece
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["25", "latest"], "older ones go"
    ck = store.latest()
    assert (ck.window, ck.virtual_time_ns, ck.controller) == (25, 9_000, state)
    assert ck.agent_blob(0) == b"c" * 10 and ck.agent_blob(1) == b"d" * 20
    assert CheckpointStore(tmp_path / "elsewhere", "{}").latest() is None
    with pytest.raises(CheckpointUnusable, match="taken with another plan"):
        CheckpointStore(tmp_path, '{"plan": 2}').latest()
    (tmp_path / "checkpoints" / "25" / "controller.pkl").write_bytes(pickle.dumps({"other": 1}))
    with pytest.raises(CheckpointUnusable, match="controller.pkl is not the file its manifest.json describes"):
        store.latest()
    store.clear()
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 1001, 4500])
def test_a_checkpoint_is_read_back_a_piece_at_a_time_and_its_last_piece_only_once_the_file_proved_whole(
        tmp_path, size):
    """restore_agents sends each agent its file as it reads it (controller/run.py): never all of it in memory, and
    never the last piece of a file that is not the one its manifest describes (the agent restores on the last)."""
    store = CheckpointStore(tmp_path, "{}")
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    store.commit(7, 100, {0: data}, {"c": 1}, {})
    ck = store.latest()
    pieces = list(ck.agent_pieces(0, 1000))
    assert b"".join(pieces) == data and len(pieces) == ck.agent_parts(0, 1000) == max(1, -(-size // 1000))
    assert all(len(p) == 1000 for p in pieces[:-1])
    if not size:
        return
    damaged = bytearray(data)
    damaged[-1] ^= 1  # in the last piece: every piece before it goes, the last does not
    (ck.path / "agent-0.ckpt").write_bytes(bytes(damaged))
    got = []
    with pytest.raises(CheckpointUnusable, match="agent-0.ckpt is not the file its manifest.json describes"):
        for p in ck.agent_pieces(0, 1000):
            got.append(p)
    assert len(got) == len(pieces) - 1
    (ck.path / "agent-0.ckpt").write_bytes(data[:-1])  # truncated
    with pytest.raises(CheckpointUnusable, match=f"{size - 1} bytes, {size} expected"):
        list(ck.agent_pieces(0, 1000))


def test_an_in_process_commit_returns_once_the_bytes_are_in_the_files_and_syncs_and_commits_on_a_thread(
        tmp_path, monkeypatch):
    from controller import checkpoints

    synced, release = [], threading.Event()

    def slow_sync(path):  # the disk: held until the test lets it go
        assert release.wait(timeout=60)
        synced.append(path.name)

    monkeypatch.setattr(checkpoints, "_sync", slow_sync)
    store, done = CheckpointStore(tmp_path, "{}"), []
    tensor = bytearray(b"x" * 1000)
    store.commit_now(4, 900, {0: Blob([b"head", memoryview(tensor)], live=True)}, {"c": 2}, {},
                     lambda d, took, waited: done.append((d, waited <= took)))
    ck = tmp_path / "checkpoints" / "4"
    assert (ck / "agent-0.ckpt").read_bytes() == b"head" + b"x" * 1000
    assert store.busy and not (ck / "manifest.json").exists() and not (tmp_path / "checkpoints" / "latest").exists()
    tensor[:] = b"y" * 1000  # the run goes on and changes its tensors: the file keeps what they were
    release.set()
    store.wait()
    assert synced == ["agent-0.ckpt", "controller.pkl"] and done == [(ck, True)]
    got = store.latest()
    assert (got.window, got.virtual_time_ns, got.controller, got.agent_blob(0)) == (4, 900, {"c": 2},
                                                                                      b"head" + b"x" * 1000)


def test_the_manifest_gives_each_files_crc32_which_finds_one_changed_byte_and_a_format_1_manifest_still_reads(
        tmp_path):
    store = CheckpointStore(tmp_path, "{}")
    blob = Blob([b"head", memoryview(bytes(range(256)) * 4)])
    d = store.commit(3, 700, {0: blob}, {"c": 1}, {})
    manifest = json.loads((d / "manifest.json").read_text())
    whole = b"head" + bytes(range(256)) * 4
    assert manifest["format"] == 2
    assert manifest["agents"] == [{"file": "agent-0.ckpt", "bytes": 1028, "crc32": f"{zlib.crc32(whole):08x}"}]
    assert (d / "agent-0.ckpt").read_bytes() == whole
    changed = bytearray(whole)
    changed[500] ^= 1  # the same length, one bit else
    (d / "agent-0.ckpt").write_bytes(bytes(changed))
    with pytest.raises(CheckpointUnusable, match=r"agent-0.ckpt is not the file .* or another CRC32\)"):
        store.latest()
    # a checkpoint written before CRC-32 (format 1: SHA-256 of each file) is read and checked as it was
    (d / "agent-0.ckpt").write_bytes(whole)
    state = (d / "controller.pkl").read_bytes()
    manifest |= {"format": 1, "agents": [{"file": "agent-0.ckpt", "bytes": 1028,
                                           "sha256": hashlib.sha256(whole).hexdigest()}],
                 "controller": {"file": "controller.pkl", "bytes": len(state),
                                "sha256": hashlib.sha256(state).hexdigest()}}
    (d / "manifest.json").write_text(json.dumps(manifest))
    ck = store.latest()
    assert (ck.window, ck.controller, ck.agent_blob(0)) == (3, {"c": 1}, whole)
    manifest["agents"][0]["sha256"] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointUnusable, match=r"agent-0.ckpt is not the file .* or another SHA256\)"):
        store.latest()


def test_a_checkpoint_round_commits_only_when_every_agent_sent_its_checkpoint_and_holds_those_that_did():
    committed = []
    ck = Checkpointer(1e-9, lambda k, blobs, view: committed.append((k, blobs, view)))
    k = ck.due(100)
    assert k == 100 + FIRST_SLACK
    ck.asked(k, {0: 7, 1: 9})
    assert not ck.is_answer(0, 8) and ck.is_answer(0, 7)
    assert ck.answer(0, ("ok", k, 0, 2, b"ab")) == "partial" and not ck.holding(0)
    assert ck.answer(0, ("ok", k, 1, 2, b"cd")) == "ok" and ck.holding(0) and not ck.complete()
    assert ck.due(200) is None, "one round at a time"
    assert ck.answer(1, ("ok", k, 0, 1, b"ef")) == "ok" and ck.complete()
    assert ck.finish({"windows": [k, k]}) and len(committed) == 1
    assert {a: bytes(b.tobytes() if isinstance(b, Blob) else b) for a, b in committed[0][1].items()} == \
        {0: b"abcd", 1: b"ef"} and committed[0][::2] == (k, {"windows": [k, k]})
    assert isinstance(committed[0][1][0], Blob), "an agent's pieces are written one by one, never joined"
    assert not ck.holding(0)
    # an agent already past K: nothing is committed, the others are released, and K goes further next time
    k = ck.due(300)
    ck.asked(k, {0: 11, 1: 12})
    ck.answer(0, ("ok", k, 0, 1, b"x"))
    ck.answer(1, ("missed", k, 0, 1, ""))
    assert not ck.holding(0) and ck.complete() and not ck.finish({})
    assert ck.due(300) == 300 + 2 * FIRST_SLACK and len(committed) == 1
    with pytest.raises(ValueError, match="an answer for window"):
        ck.asked(500, {0: 13, 1: 14})
        ck.answer(0, ("ok", 499, 0, 1, b""))


def test_a_round_writes_each_piece_to_its_agents_file_as_it_comes_and_holds_none_of_them(tmp_path):
    """With the store's stage (what `lockstep run` uses) the controller keeps no piece: each goes to its agent's
    file, its CRC-32 taken on the way; the commit syncs and names them. A lost round leaves no file."""
    store = CheckpointStore(tmp_path, "{}")
    commits = []
    ck = Checkpointer(1e-9, lambda k, blobs, view: commits.append(store.commit(k, 50, blobs, view, {})),
                      stage=store.stage)
    k = ck.due(100)
    ck.asked(k, {0: 1, 1: 2})
    staged = tmp_path / "checkpoints" / str(k)
    pieces = [bytes([i]) * (1000 + i) for i in range(3)]
    for i, piece in enumerate(pieces):
        ck.answer(0, ("ok", k, i, 3, piece))
        assert (staged / "agent-0.ckpt").stat().st_size == sum(map(len, pieces[:i + 1])), "written as it came"
    assert ck.round.parts == {} and ck.holding(0)
    ck.answer(1, ("ok", k, 0, 1, b"only"))
    assert ck.finish({"windows": [k, k]})
    assert commits == [staged] and not list(tmp_path.glob("checkpoints/*/*.tmp"))
    manifest = json.loads((staged / "manifest.json").read_text())
    whole = b"".join(pieces)
    assert manifest["agents"] == [{"file": "agent-0.ckpt", "bytes": len(whole), "crc32": f"{zlib.crc32(whole):08x}"},
                                  {"file": "agent-1.ckpt", "bytes": 4, "crc32": f"{zlib.crc32(b'only'):08x}"}]
    got = store.latest()
    assert (got.window, got.controller, got.agent_blob(0), got.agent_blob(1)) == (k, {"windows": [k, k]}, whole,
                                                                                   b"only")
    # a round that will not commit (an agent already past its window): its files go, the last checkpoint stays
    k2 = ck.due(300)
    ck.asked(k2, {0: 3, 1: 4})
    ck.answer(0, ("ok", k2, 0, 2, b"half"))
    assert (tmp_path / "checkpoints" / str(k2) / "agent-0.ckpt").exists()
    ck.answer(1, ("missed", k2, 0, 1, ""))
    ck.answer(0, ("ok", k2, 1, 2, b"rest"))
    assert not ck.finish({}) and not (tmp_path / "checkpoints" / str(k2)).exists()
    assert store.latest().window == k and len(commits) == 1
    # a round left unfinished (its agent lost): the next round's stage drops its files
    k3 = ck.due(400)
    ck.asked(k3, {0: 5})
    ck.answer(0, ("ok", k3, 0, 2, b"lost"))
    again = Checkpointer(1e-9, lambda *a: None, stage=store.stage)  # what recovery's next drive() makes
    again.asked(again.due(900), {0: 6})
    assert not (tmp_path / "checkpoints" / str(k3)).exists() and store.latest().window == k
    # a round asking for the committed window again (the hub's loop right after a restore from it): kept as it is
    same = Checkpointer(1e-9, lambda *a: commits.append(a), stage=store.stage)
    same.asked(k, {0: 7})
    same.answer(0, ("ok", k, 0, 1, b"other bytes"))
    assert not same.finish({}) and len(commits) == 1
    assert (store.latest().window, store.latest().agent_blob(0)) == (k, whole)


def test_a_round_that_cannot_write_its_pieces_commits_nothing_and_says_why(tmp_path, caplog):
    store = CheckpointStore(tmp_path, "{}")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / str(100 + FIRST_SLACK)).write_text("a file where the directory goes")
    committed = []
    ck = Checkpointer(1e-9, lambda *a: committed.append(a), stage=store.stage)
    k = ck.due(100)
    ck.asked(k, {0: 1})
    ck.answer(0, ("ok", k, 0, 1, b"piece"))
    with caplog.at_level("WARNING", logger="lockstep.controller"):
        assert not ck.finish({})
    assert committed == [] and f"could not write checkpoint {k}" in caplog.text


def test_a_checkpoint_that_took_long_to_write_spaces_the_next_ones():
    committed = []
    ck = Checkpointer(10.0, lambda k, blobs, view: committed.append(blobs))
    assert ck.due(0, exact=True) is None, "10 s after the start at the earliest"
    ck._last -= 10.0
    ck.asked(ck.due(0, exact=True), {0: 1})
    blob = Blob([b"in-process ", bytearray(b"agent")])  # an in-process agent answers with its Blob, whole
    ck.answer(0, ("ok", 0, 0, 1, blob))
    assert ck.finish({}) and committed == [{0: blob}]
    ck.written(9.9)  # a 3.3 GB checkpoint (10 000 vworkers) took 9.9 s to write: the next one 99 s later
    assert ck.spacing == pytest.approx(99.0 + 10 * ck.gathered_s) and ck.gathered_s < 1.0
    ck._last = time.monotonic() - 98.0
    assert ck.due(5, exact=True) is None
    ck._last = time.monotonic() - 100.0
    assert ck.due(5, exact=True) == 5
    ck.written(0.2)  # a small one: every_s again
    assert ck.spacing == 10.0


def test_the_time_a_round_took_to_gather_counts_with_its_write_in_the_spacing():
    ck = Checkpointer(10.0, lambda k, blobs, view: None)
    ck._last -= 10.0
    ck.asked(ck.due(0, exact=True), {0: 1, 1: 2})
    ck.round.asked_at -= 5.0  # the agents' snapshots and their pieces took 5 s to come in
    ck.answer(0, ("ok", 0, 0, 1, b"a"))
    ck.answer(1, ("ok", 0, 0, 1, b"b"))
    assert ck.finish({})
    assert 5.0 <= ck.gathered_s < 6.0
    ck.written(8.0)  # then 8 s to write: the next round no sooner than 10 x (5 + 8) s later
    assert ck.spacing == pytest.approx(10 * (ck.gathered_s + 8.0)) and ck.spacing >= 130.0


def test_a_strategy_that_refuses_again_and_again_is_not_asked_any_more():
    ck = Checkpointer(1e-9, lambda *a: None)
    for i in range(REFUSALS_BEFORE_GIVING_UP):
        assert ck.enabled
        k = ck.due(10)
        ck.asked(k, {0: i})
        ck.answer(0, ("refused", k, 0, 1, f"vworker {i} waits where its strategy cannot say"))
        ck.finish({})
    assert not ck.enabled and ck.due(10) is None
    once = Checkpointer(1e-9, lambda *a: None)
    once.asked(once.due(0), {0: 1})
    once.answer(0, ("refused_permanent", FIRST_SLACK, 0, 1, "ring_allreduce cannot say where it is"))
    assert not once.enabled


class _RecordingAgent:
    """An agent's handle as restore_agents uses it, answering each restore call as a real agent does (None, then
    ("ok", window) for the last piece) and recording what it was sent and when it was asked for an answer."""

    def __init__(self, agent_id, log, window, limit):
        from agents.common import wire
        from protos.lockstep.v1 import agent_pb2 as pb

        self.agent_id, self.log, self.window, self._calls = agent_id, log, window, 0
        self.unanswered, self.got, self.most_unanswered = [], [], 0
        outer = self

        class Session:
            writer = wire.FrameWriter(pb.ControllerFrame, limit)

            @staticmethod
            def send_serialized(frame):
                call = pb.ControllerFrame.FromString(frame).call
                part, parts, piece = wire.decode_value(call.args)
                outer.log.append(("sent", agent_id, part))
                outer.got.append(piece)
                outer.unanswered.append((call.id, part == parts - 1))
                outer.most_unanswered = max(outer.most_unanswered, len(outer.unanswered))

        self.session = Session()

    def _receive(self, what):
        from agents.common import wire
        from protos.lockstep.v1 import agent_pb2 as pb

        call_id, last = self.unanswered.pop(0)
        f = pb.AgentFrame()
        f.reply.id = call_id
        wire.encode_value(("ok", self.window) if last else None, f.reply.value)
        return f, {}


def test_a_restore_sends_the_agents_pieces_in_turn_so_that_they_take_them_side_by_side(tmp_path):
    """controller/run.py restore_agents: one piece of each agent's file in turn, never more than RESTORE_IN_FLIGHT of
    an agent's unanswered, each agent's bytes whole and in order (before, agent 1's pieces went only once agent 0's
    were all out, so at 10 000 vworkers it restored 14 s later: docs/benchmarks.md)."""
    from controller.run import RESTORE_IN_FLIGHT, restore_agents

    store = CheckpointStore(tmp_path, "{}")
    files = {0: bytes(range(256)) * 80, 1: bytes(reversed(range(256))) * 60}  # 20 480 and 15 360 bytes
    store.commit(7, 100, files, {"c": 1}, {})
    ck = store.latest()
    log = []
    agents = [_RecordingAgent(a, log, 7, 4096) for a in (0, 1)]  # pieces of 2 048 bytes: 10 and 8 of them
    restore_agents(agents, ck)
    assert [b"".join(a.got) for a in agents] == [files[0], files[1]]
    assert log == [("sent", a, p) for p in range(8) for a in (0, 1)] + [("sent", 0, 8), ("sent", 0, 9)]
    assert [a.most_unanswered for a in agents] == [RESTORE_IN_FLIGHT] * 2 and not any(a.unanswered for a in agents)
    (ck.path / "agent-1.ckpt").write_bytes(files[1][:-1] + b"x")  # damaged: its last piece never goes
    log.clear()
    agents = [_RecordingAgent(a, log, 7, 4096) for a in (0, 1)]
    with pytest.raises(CheckpointUnusable, match="agent-1.ckpt is not the file its manifest.json describes"):
        restore_agents(agents, ck)
    assert ("sent", 1, 7) not in log and ("sent", 1, 6) in log
