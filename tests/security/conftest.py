"""Fixtures of the security tests: a controller with a fixed plan (tests/distributed/fakes.py), certificates."""
from __future__ import annotations

import pytest

from tests.distributed.fakes import plan, server  # noqa: F401  (fixtures)

from .certs import CA


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """The run's CA with one certificate for the controller and its agents, and a stranger's CA."""
    ca = CA(tmp_path_factory.mktemp("pki"))
    other = CA(tmp_path_factory.mktemp("other-pki"), name="someone-elses-ca")
    return {"ca": ca, "node": ca.issue("lockstep-node"), "other_ca": other, "stranger": other.issue("stranger")}
