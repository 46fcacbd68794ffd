"""The import contracts of pyproject.toml hold (agents/ never imports controller/; kubernetes only in its launcher)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    p = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Contracts: 4 kept, 0 broken." in p.stdout
