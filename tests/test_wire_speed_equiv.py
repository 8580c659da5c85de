"""The wire's shortcuts give the bytes of the long way: `envelope_values` (what `DtsKafkaSink`
produces: an Entries' items joined under one Envelope header) is the encoding of each Envelope
`split_entries` builds, and `encode_varint`'s one- and two-byte cases are the general loop's."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge import pb
from bridge.wire.framing import _ENVELOPE_OVERHEAD, encode_varint, envelope_values, split_entries


def _varint(value: int) -> bytes:
    """The general loop (what encode_varint did for every value)."""
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _long_way(parts: list[bytes], max_message_bytes: int) -> list[bytes]:
    return [env.SerializeToString() for env in split_entries(b"".join(parts), max_message_bytes)]


@given(parts=st.lists(st.binary(max_size=300), max_size=12), limit=st.integers(_ENVELOPE_OVERHEAD + 1, 2_000))
def test_envelope_values_are_the_envelopes_encodings(parts, limit):
    got = envelope_values(parts, limit)
    assert got == _long_way(parts, limit)
    assert all(type(value) is bytes for value in got)
    assert b"".join(pb.Envelope.FromString(value).data for value in got) == b"".join(parts)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 999_975, 999_976, 999_977, 1_048_576 + 5])
def test_envelope_values_at_the_edges(size):
    """Sizes where the data's length takes another varint byte, and around one Envelope's room
    (1,000,000 - 24 bytes of data fit in one)."""
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    for parts in ([data], [data[:size // 3], b"", data[size // 3:]]):
        assert envelope_values(parts, 1_000_000) == _long_way(parts, 1_000_000)
    assert envelope_values([], 1_000_000) == _long_way([], 1_000_000)


def test_envelope_values_refuses_what_split_entries_refuses():
    for limit in (_ENVELOPE_OVERHEAD, 0, -5):
        with pytest.raises(ValueError):
            envelope_values([b"x"], limit)
        with pytest.raises(ValueError):
            split_entries(b"x", limit)


@given(st.one_of(st.integers(0, 0x4100), st.integers(0, 2**64), st.sampled_from([0, 127, 128, 16_383, 16_384])))
def test_encode_varint_is_the_general_loop(value):
    assert encode_varint(value) == _varint(value)
    assert type(encode_varint(value)) is bytes


def test_encode_varint_everywhere_below_three_bytes():
    assert [encode_varint(v) for v in range(0x4000 + 2)] == [_varint(v) for v in range(0x4000 + 2)]
    assert encode_varint(True) == _varint(True) == b"\x01" and encode_varint(False) == b"\x00"
