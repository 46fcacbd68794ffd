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
