"""``memory=auto|compact|fast``: whether an agent's allocator gives freed tensors back to the OS (agents/core.py).

The allocator setting lasts for the life of a process, so each case runs in a fresh Python process.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.conftest import run

ROOT = Path(__file__).resolve().parents[2]

# A tensor of 1 MiB is allocated and freed once (glibc then raises its mmap threshold above 1 MiB), then 256 of
# them (256 MiB) are allocated, each followed by a long-lived 64 KiB one, then the big ones are freed: from the
# heap, the 64 KiB ones pin it and the resident set stays up; each in its own mapping, it falls back to the
# 16 MiB of small ones.
_PROBE = """
import json, sys, torch
from agents.core import use_memory
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
compact = use_memory(sys.argv[1], int(sys.argv[2]))
t = torch.ones(1 << 18)
del t
base = rss()
big, small = [], []
for _ in range(256):
    big.append(torch.ones(1 << 18))
    small.append(torch.ones(1 << 14))  # 64 KiB: from the heap in either mode, after each big one
peak = rss()
big.clear()
print(json.dumps({"compact": compact, "grown": peak - base, "kept": rss() - base}))
"""


def _probe(mode: str, vworkers: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode, str(vworkers)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("mode, vworkers, compact", [("compact", 1, True), ("auto", 1000, True),
                                                      ("auto", 999, False), ("fast", 100_000, False)])
def test_compact_memory_gives_freed_tensors_back_and_fast_keeps_them(mode, vworkers, compact):
    r = _probe(mode, vworkers)
    assert r["compact"] is compact
    assert r["grown"] >= 250 << 20  # the 256 MiB were really resident
    if compact:
        assert r["kept"] < 24 << 20, r
    else:
        assert r["kept"] >= 250 << 20, r  # glibc's default keeps the heap: what compact is for


def test_the_summary_says_which_agents_compact_their_memory(tmp_path):
    over = ["workers=4", "agents=2", "model=mlp", "stop.updates=20", "launcher=local"]
    compact = run(tmp_path / "compact", over + ["memory=compact"], local=True)
    auto = run(tmp_path / "auto", over, local=True)
    assert compact.summary["peak_memory"]["agents_compact"] == [True, True]
    assert auto.summary["peak_memory"]["agents_compact"] == [False, False]  # 5 vworkers: below 1 000
    assert (tmp_path / "compact" / "metrics.csv").read_text().count("\n") == 21


# Pieces of 4 MiB copied and freed one after the other (a restore's, agents/agent.py), counting the page faults; then,
# compact again, the probe above: the freed tensors go back to the OS.
_PASSING = """
import json, resource, sys, torch
from agents.core import passing_buffers, use_memory
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
use_memory("compact", 1)
src = bytes(4 << 20)
def copies():
    f = faults()
    for _ in range(64):
        piece = bytes(bytearray(src))
        del piece
    return faults() - f
out = {"compact": copies(), "took": passing_buffers(sys.argv[1] == "on")}
out["passing"] = copies()
out["back"] = passing_buffers(False)
base = rss()
big, small = [], []
for _ in range(256):
    big.append(torch.ones(1 << 18))
    small.append(torch.ones(1 << 14))
peak = rss()
big.clear()
out.update(grown=peak - base, kept=rss() - base)
print(json.dumps(out))
"""


@pytest.mark.parametrize("passing", ["on", "off"])
def test_a_compact_agent_passes_a_restores_pieces_through_the_heap_and_is_compact_again_after(passing):
    """agents.core.passing_buffers: 64 pieces of 4 MiB, each copied twice, fault ~1 024 pages each when every
    copy gets its own mapping (compact); through the heap the pages of one piece serve the next. Once it is off, a
    freed tensor goes back to the OS again, as use_memory's compact promises."""
    out = subprocess.run([sys.executable, "-c", _PASSING, passing], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True)
    r = json.loads(out.stdout)
    assert r["compact"] >= 2 * 64 * 1024 * 0.9, r  # two fresh mappings a piece, 1 024 pages each
    assert r["took"] is True and r["back"] is True
    if passing == "on":
        assert r["passing"] < 64 * 1024 * 0.1, r
    else:
        assert r["passing"] >= 2 * 64 * 1024 * 0.9, r
    assert r["grown"] >= 250 << 20 and r["kept"] < 24 << 20, r
