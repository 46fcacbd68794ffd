"""Fixtures of the observability tests; ``prom_server`` starts a real Prometheus (see prom.py)."""
from .prom import prom_server  # noqa: F401  (re-exported fixture)
