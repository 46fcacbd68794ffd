"""The run directory (DESIGN §8): config, plan, metrics.csv, eval.csv, summary.json, params, plots.

Rows are appended as windows complete, so a run that dies keeps every row
written so far readable; summary.json is written last (atomically).
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from agents.common.files import write_atomic
from agents.sim.env import EVAL_COLUMNS, UPDATE_COLUMNS

__all__ = ["RunDir", "read_csv", "upload", "write_json_atomic"]


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV this module wrote; a last row cut short (the run was killed mid-write) is left out."""
    with open(path, newline="") as f:
        text = f.read()
    rows = list(csv.DictReader(io.StringIO(text)))
    if rows and (not text.endswith("\n") or None in rows[-1].values()):
        rows.pop()
    return rows


def _fmt(v: Any) -> Any:
    # repr of a float round-trips exactly, so bit-identical runs give byte-identical files
    return repr(v) if isinstance(v, float) else v


class RunDir:
    """Writers for one run directory."""

    def __init__(self, path: Path, extra_columns: tuple[str, ...] = ()):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._metrics = open(self.path / "metrics.csv", "w", newline="")
        self._eval = open(self.path / "eval.csv", "w", newline="")
        self._mw = csv.writer(self._metrics)
        self._ew = csv.writer(self._eval)
        self._mw.writerow((*UPDATE_COLUMNS, *extra_columns))  # extra: e.g. the data-on-network totals
        self._ew.writerow(EVAL_COLUMNS)
        self.n_updates = 0

    def write_updates(self, rows: list[tuple]) -> None:
        for r in rows:
            self._mw.writerow([_fmt(v) for v in r])
        self.n_updates += len(rows)
        self._metrics.flush()

    def write_evals(self, rows: list[tuple]) -> None:
        for r in rows:
            self._ew.writerow([_fmt(v) for v in r])
        self._eval.flush()

    def close(self) -> None:
        self._metrics.close()
        self._eval.close()


def upload(run_dir: Path, url: str) -> str:
    """Copy ``run_dir`` to ``<url>/<run_dir name>`` with fsspec (``outputs.upload``); returns the destination.

    Any fsspec URL: ``file:///...``, ``s3://bucket/prefix`` (``pip install 'lockstep[upload]'`` brings s3fs and
    gcsfs; credentials come from the environment, e.g. AWS_ACCESS_KEY_ID or a mounted secret).
    """
    import fsspec  # noqa: PLC0415 - only a run that uploads needs it

    fs, root = fsspec.core.url_to_fs(url)
    dest = f"{root.rstrip('/')}/{Path(run_dir).name}"
    fs.makedirs(dest, exist_ok=True)
    for f in sorted(Path(run_dir).rglob("*")):
        if f.is_file():
            target = f"{dest}/{f.relative_to(run_dir).as_posix()}"
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
            fs.put_file(str(f), target)
    return f"{url.split('://', 1)[0]}://{dest}" if "://" in url else dest
