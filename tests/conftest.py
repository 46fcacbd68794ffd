"""The suite's own scheduling under pytest-xdist (``make test`` runs ``pytest -n 2 --dist loadgroup
--no-loadscope-reorder``; docs/testing.md).

Each file is one group, run on one worker, so its module fixtures are built once; the Kubernetes tests share
one group (their kube-apiserver and etcd start once per worker, ~10 s) and the Ray tests another (one Ray
cluster per worker, 200 MB of object store). The calibration tests are a group each: together they are 40 % of
the suite's time (31 of 78 minutes measured on 2026-12-02), so they go to both workers, and they go first with
the other long groups, so that no worker is left with a long test at the end. Without xdist nothing changes
but the order of the tests.
"""
from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent
_ONE_WORKER = ("k8s", "ray")  # directories whose session fixtures are servers worth starting once
_EACH_TEST = ("validation/test_calibration.py",)  # files whose tests are groups of their own
# the longest groups, longest first (seconds per group, measured with -n 2 on 2026-12-02; the rest are < 100 s)
_FIRST = ("validation/test_calibration.py",  # 806, 642, 278, 105 s and more: four of the five longest tests
          "recovery/test_checkpoints.py",  # 478
          "ray",  # 395
          "security/test_fuzz.py",  # 186
          "engine/test_device_profiles.py",  # 172
          "recovery/test_recovery.py",  # 155
          "engine/test_checkpoint.py",  # 131
          "k8s")  # 250, with a server start


def _group(item: pytest.Item) -> tuple[str, str]:
    """(the group's key in _FIRST, the group's name)."""
    rel = Path(item.fspath).relative_to(_HERE)
    top, path = rel.parts[0], rel.as_posix()
    if top in _ONE_WORKER:
        return top, top
    if path in _EACH_TEST:
        return path, item.nodeid
    return path, path


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the marks into its groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {key: i for i, key in enumerate(_FIRST)}
    groups = {}
    for item in items:
        key, name = _group(item)
        item.add_marker(pytest.mark.xdist_group(name))
        groups[item.nodeid] = rank.get(key, len(_FIRST))
    items.sort(key=lambda it: groups[it.nodeid])  # stable: every file keeps its own order
