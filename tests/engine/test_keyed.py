"""The keyed draws' digest (DESIGN §4): every random number of every run is a function of these bytes, so
they may never change — not when the code that computes them is made faster."""
from __future__ import annotations

import hashlib
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.sim import keyed


def _reference(*key: object) -> bytes:
    """The encoding as documented in keyed.key_bytes, one part at a time."""
    h = hashlib.blake2b(digest_size=16)
    for part in key:
        if isinstance(part, (bool, int)):
            h.update(b"i" + int(part).to_bytes(16, "little", signed=True))
        elif isinstance(part, str):
            data = part.encode()
            h.update(b"s" + len(data).to_bytes(4, "little") + data)
        else:
            h.update(b"f" + struct.pack("<d", part))
    return h.digest()


def test_the_digests_of_known_keys_never_change():
    assert keyed.key_bytes(3, "ack", 1, 0, 123456).hex() == "23749905fca42200a681e2f5f1331caa"
    assert keyed.key_bytes(0, "start", 4).hex() == "ffbe890d1a6a850d897916990792840c"
    assert keyed.key_bytes(7, "x", 1.5, True, -3, "ünï").hex() == "163fabfc7539c552082d8950c12cee52"
    assert keyed.uniform(3, "ack", 1, 0, 123456) == (keyed.key_int(3, "ack", 1, 0, 123456) >> 11) / (1 << 53)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(-(1 << 100), 1 << 100), st.booleans(), st.text(max_size=12),
                          st.floats(allow_nan=False)), max_size=8))
def test_a_key_digests_as_its_documented_encoding(key):
    assert keyed.key_bytes(*key) == _reference(*key)


def test_a_key_part_of_another_type_is_refused():
    import pytest

    with pytest.raises(TypeError, match="unsupported key part"):
        keyed.key_bytes(1, b"bytes")
    with pytest.raises(TypeError, match="unsupported key part"):
        keyed.key_bytes(None)
