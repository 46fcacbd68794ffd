"""Fixtures: run composed configs in-process (see tests/inprocess.py)."""
from tests.inprocess import run  # noqa: F401  (a fixture)
