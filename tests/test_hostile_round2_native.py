"""Issue 29, the C-only findings. Finding 6: C's `split_items` (and every C walk over protobuf
bytes: `read_tag` and `read_size` in bridge/native/src/speedups.h) refuses every tag and length
protobuf (upb) refuses: a tag or a length spelt in more than 5 bytes, a tag above 2^32 - 1 (a field
number of 2^29 or more), field number 0, wire types 4 (no group open), 6 and 7; a group (3), which
protobuf skips, C leaves to protobuf. Finding 7: the UTF-8 cache (`keep_utf8`,
bridge/native/src/writers.c) writes only into strs the writer made, never into CPython's shared
one-character latin-1 strs, and only on the CPython versions it was tested on."""
from __future__ import annotations

import ctypes
import platform
import sys

import pytest
from google.protobuf.message import DecodeError as ProtobufDecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bridge
from bridge import pb
from bridge.errors import DecodeError
from bridge.native import NATIVE, speedups
from support.wire_spec import varint

needs_native = pytest.mark.skipif(not NATIVE, reason="C extension switched off (BRIDGE_PURE_PYTHON)")


# ---- finding 6: tags and lengths as protobuf reads them -----------------------------------------

def protobuf_parses(data: bytes, message=pb.Entries) -> bool:
    try:
        message.FromString(data)
    except ProtobufDecodeError:
        return False
    return True


def meets_group(data: bytes) -> bool:
    """The top-level fields of the bytes, read by upb's rules up to the first thing it refuses: does
    one start a group (which protobuf skips and C leaves to it)?"""
    p = 0
    while p < len(data):
        tag = 0
        for i in range(5):
            if p + i >= len(data):
                return False
            tag |= (data[p + i] & 0x7F) << (7 * i)
            if not data[p + i] & 0x80:
                break
        else:
            return False
        p += i + 1
        wt = tag & 7
        if tag > 0xFFFFFFFF or tag >> 3 == 0 or wt in (4, 6, 7):
            return False
        if wt == 3:
            return True
        if wt == 0:
            for i in range(10):
                if p + i >= len(data):
                    return False
                if not data[p + i] & 0x80:
                    break
            else:
                return False
            p += i + 1
        elif wt in (1, 5):
            p += 8 if wt == 1 else 4
        else:
            size = 0
            for i in range(5):
                if p + i >= len(data):
                    return False
                size |= (data[p + i] & 0x7F) << (7 * i)
                if not data[p + i] & 0x80:
                    break
            else:
                return False
            p += i + 1 + size
    return False


def assert_split_like_protobuf(data: bytes) -> None:
    """C's split_items against protobuf's parse of the same Entries: a list only where protobuf
    parses the framing, and then exactly its items; None wherever protobuf refuses (or, C's own
    choice, where it meets a group protobuf would skip). valid_entries is never True where protobuf refuses."""
    ok = protobuf_parses(data)
    got = speedups.split_items(data)
    if speedups.valid_entries(data):
        assert ok, "valid_entries says protobuf parses bytes it refuses"
    if got is None:
        assert not ok or meets_group(data), "C refused an Entries protobuf parses (no group in it)"
        return
    items_ok = all(protobuf_parses(item, pb.Entry) for item in got)
    assert ok == items_ok, ("C split an Entries protobuf refuses" if not ok
                            else "an item C split does not parse, though protobuf parses the Entries")
    if ok:
        assert [pb.Entry.FromString(item) for item in got] == list(pb.Entries.FromString(data).items)


ENTRY = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.HEARTBEAT, timestamp=1_700_000_000,
                                  seqId=9),
                 event=pb.Event(heartbeatEvent=pb.HeartbeatEvent(epoch=1_700_000_000))).SerializeToString()

# (spelling of the tag, the bytes after it), each at an edge of what protobuf takes
EDGE_TAGS = [
    (varint(1 << 3 | 2, 5), True),                     # overlong but 5 bytes: protobuf takes it
    (varint(1 << 3 | 2, 6), False),                    # 6 bytes
    (varint(1 << 3 | 2, 10), False),                   # 10 bytes
    (varint((1 << 32) | (1 << 3 | 2)), False),         # above 2^32: field 2^29 + 1 truncated to 1 by a uint32 cast
    (varint((1 << 35) | (2 << 3 | 2)), False),         # ... truncated to field 2 (C skipped the Entry: 0 lines)
    (varint((1 << 29) << 3 | 2), False),               # field 2^29
    (varint(((1 << 29) - 1) << 3 | 2), True),          # field 2^29 - 1: unknown, skipped
    (varint(0 << 3 | 2), False),                       # field 0
]


@needs_native
@pytest.mark.parametrize("tag,ok", EDGE_TAGS, ids=[t.hex() for t, _ in EDGE_TAGS])
def test_an_edge_tag_before_an_entry_is_refused_where_protobuf_refuses_it(tag, ok):
    data = tag + varint(len(ENTRY)) + ENTRY
    assert protobuf_parses(data) == ok
    assert (speedups.split_items(data) is not None) == ok
    assert_split_like_protobuf(data)


@needs_native
@pytest.mark.parametrize("size,ok", [(1, True), (5, True), (6, False), (10, False)])
def test_a_length_spelt_in_more_than_5_bytes_is_refused(size, ok):
    for data in (b"\x0a" + varint(len(ENTRY), size) + ENTRY,                   # an item's length
                 b"\x0a" + varint(len(ENTRY)) + ENTRY + b"\x12" + varint(0, size)):  # an unknown field's
        assert protobuf_parses(data) == ok
        assert (speedups.split_items(data) is not None) == ok
        assert speedups.valid_entries(data) == ok
        assert_split_like_protobuf(data)


@needs_native
@pytest.mark.parametrize("wt", range(8))
def test_each_wire_type_on_field_1_and_an_unknown_field(wt):
    payload = {0: b"\x01", 1: b"\x00" * 8, 2: varint(len(ENTRY)) + ENTRY, 3: b"", 4: b"", 5: b"\x00" * 4,
               6: b"\x00", 7: b"\x00"}[wt]
    for field in (1, 2, 15, (1 << 29) - 1):
        tag = varint(field << 3 | wt)
        close = varint(field << 3 | 4) if wt == 3 else b""
        data = b"\x0a" + varint(len(ENTRY)) + ENTRY + tag + payload + close
        assert_split_like_protobuf(data)
        if wt in (0, 1, 2, 5):  # protobuf takes these (field 1 of another type: an unknown field)
            assert speedups.split_items(data) is not None


def test_the_truncated_tag_no_longer_drops_an_entry():
    """The issue's case: a tag above 2^35 whose low 32 bits of field number are 2 made C skip the
    Entry as an unknown field (0 lines, no error); now the library raises DecodeError, as the
    protobuf path does."""
    data = varint((1 << 35) | (2 << 3 | 2)) + varint(len(ENTRY)) + ENTRY
    with pytest.raises(DecodeError):
        bridge.entries_to_blob_lines(data)


def test_an_entry_spelt_in_5_byte_tags_converts_as_protobuf_reads_it():
    """What protobuf takes (overlong tags and lengths of at most 5 bytes) C takes too: the same lines."""
    data = varint(1 << 3 | 2, 5) + varint(len(ENTRY), 5) + ENTRY
    expected = bridge.entries_to_blob_lines(pb.Entries.FromString(data).SerializeToString())
    assert bridge.entries_to_blob_lines(data) == expected
    if NATIVE:
        assert speedups.split_items(data) == [ENTRY]


# A field of an Entries, spelt at the edges: its field number and wire type, the tag's spelling
# (its own size, overlong, or bits above 2^32), and a payload that fits the wire type or not.
_FIELDS = st.sampled_from([0, 1, 1, 1, 2, 15, (1 << 29) - 1, 1 << 29, (1 << 32) + 1, (1 << 32) + 2])


@st.composite
def _edge_field(draw, entries):
    field, wt = draw(_FIELDS), draw(st.integers(0, 7))
    value = field << 3 | wt
    spelling = draw(st.sampled_from(["plain", "plain", "overlong", "high"]))
    if spelling == "overlong":
        tag = varint(value, max(len(varint(value)), draw(st.integers(1, 11))))
    elif spelling == "high":  # bits above 2^32 a 32-bit cast would drop
        tag = varint(value | draw(st.sampled_from([1 << 32, 1 << 35, 1 << 40, 1 << 63])))
    else:
        tag = varint(value)
    if wt == 0:
        payload = varint(draw(st.integers(0, (1 << 64) - 1)), draw(st.sampled_from([None, 10, 11])))
    elif wt in (1, 5):
        payload = b"\x00" * draw(st.sampled_from([8 if wt == 1 else 4, 3]))
    elif wt == 2:
        body = draw(st.one_of(st.sampled_from(entries), st.binary(max_size=12)))
        size = len(varint(len(body)))
        payload = varint(len(body) + draw(st.sampled_from([0, 0, 0, 1, -1])),
                         draw(st.sampled_from([size, size, 5, 6, 10]))) + body
    elif wt == 3:
        payload = draw(st.sampled_from([varint(field << 3 | 4), b"", varint((field + 1) << 3 | 4)]))
    else:
        payload = draw(st.binary(max_size=2))
    return tag + payload


def _entries():
    out = [ENTRY, b""]
    for mt in (pb.BEGIN, pb.COMMIT, pb.DML):
        out.append(pb.Entry(header=pb.Header(version=1, messageType=mt, seqId=mt)).SerializeToString())
    return out


@needs_native
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=600)
@given(data=st.data())
def test_split_items_refuses_exactly_where_protobuf_refuses(data):
    """Hypothesis: Entries of valid items with fields at the edges among them (overlong tags and
    lengths, tags above 2^32, field 0, 2^29 - 1 and 2^29, every wire type, cut values)."""
    entries = _entries()
    fields = data.draw(st.lists(st.one_of(st.sampled_from(entries).map(lambda e: b"\x0a" + varint(len(e)) + e),
                                          _edge_field(entries)), max_size=5))
    assert_split_like_protobuf(b"".join(fields))


@needs_native
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(data=st.data())
def test_valid_entries_never_vouches_for_bytes_protobuf_refuses(data):
    """Hypothesis: an edge field inside an Entry (the Header, the Event, the Entry itself): C's
    valid_entries says True only where protobuf parses."""
    entries = _entries()
    inner = b"".join(data.draw(st.lists(_edge_field(entries), min_size=1, max_size=3)))
    where = data.draw(st.sampled_from(["entry", "header", "event"]))
    if where == "entry":
        entry = ENTRY + inner
    else:
        entry = ENTRY + varint(1 << 3 | 2 if where == "header" else 2 << 3 | 2) + varint(len(inner)) + inner
    data_bytes = b"\x0a" + varint(len(entry)) + entry
    assert_split_like_protobuf(data_bytes)
    if speedups.valid_entries(data_bytes):
        assert protobuf_parses(data_bytes)


# ---- finding 7: the UTF-8 cache writes only into strs the writer made --------------------------

_CPYTHON_LAYOUT = platform.python_implementation() == "CPython" and (3, 11) <= sys.version_info[:2] <= (3, 12)
needs_layout = pytest.mark.skipif(not _CPYTHON_LAYOUT, reason="reads CPython 3.11/3.12's compact str layout")


def _utf8_offset() -> int:
    """The offset of PyCompactUnicodeObject.utf8 (3.11: after wstr; 3.12: no wstr), checked against
    what PyUnicode_AsUTF8 returns for a str of our own."""
    offset = 56 if sys.version_info[:2] == (3, 11) else 48
    probe = "".join(["caf", "\xe9", "!"])
    as_utf8 = ctypes.pythonapi.PyUnicode_AsUTF8
    as_utf8.restype = ctypes.c_void_p
    as_utf8.argtypes = [ctypes.py_object]
    assert ctypes.c_void_p.from_address(id(probe) + offset).value is None
    pointer = as_utf8(probe)
    assert ctypes.c_void_p.from_address(id(probe) + offset).value == pointer
    return offset


def _utf8_pointer(text: str, offset: int) -> int | None:
    return ctypes.c_void_p.from_address(id(text) + offset).value


def _latin1_entry(values: list[bytes]) -> pb.Entry:
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1_700_000_000,
                                      schemaName="s", tableName="t", seqId=7))
    dml = entry.event.dmlEvent
    dml.dmlEventType = pb.INSERT
    dml.columns.add(name="id", originalType="bigint(20)", isKey=True)
    dml.columns.add(name="t", originalType="varchar(255)")
    for index, value in enumerate(values):
        row = dml.rows.add()
        row.newColumns.add(dataType=pb.INT64, sv=str(index))
        row.newColumns.add(dataType=pb.STRING, charset="latin1", bv=value)
    return entry


@needs_native
@needs_layout
def test_a_one_character_latin1_value_leaves_cpythons_singleton_alone():
    """A latin1 column whose value is one byte (b'\\xe9': the charset table's one-character result,
    which CPython hands out as its shared singleton str): C's dict writer leaves that str as it was,
    with no UTF-8 of its own written into it."""
    offset = _utf8_offset()
    # the singletons this process has not yet given a UTF-8 form to (CPython fills it on first use)
    fresh = [b for b in range(0xA0, 0x100) if _utf8_pointer(chr(b), offset) is None]
    if not fresh:  # CPython 3.12 builds them with it; on 3.11 an earlier test may have filled them all
        pytest.skip("every latin-1 singleton already has its UTF-8 form")
    messages = bridge.entry_to_blob(_latin1_entry([bytes([b]) for b in fresh]))
    values = [m["payload"]["after"]["dataColumn"]["t"] for m in messages]
    assert values == [chr(b) for b in fresh]
    for b, value in zip(fresh, values):
        assert _utf8_pointer(chr(b), offset) is None, f"C wrote a UTF-8 form into the singleton {chr(b)!r}"
        assert value.encode() == chr(b).encode() == bytes([b]).decode("latin-1").encode()
    for b in fresh:
        assert chr(b).encode("utf-8") == bytes([0xC0 | b >> 6, 0x80 | b & 0x3F])


@needs_native
@needs_layout
def test_the_writer_still_keeps_the_utf8_of_the_strs_it_makes():
    """The gate lets 3.11 and 3.12 through: a str the writer makes (more than one character, UTF-8
    or a table charset) carries its UTF-8, and it is the text's own."""
    offset = _utf8_offset()
    messages = bridge.entry_to_blob(_latin1_entry([b"caf\xe9", b"\xe9\xe8"]))
    for message, text in zip(messages, ["caf\xe9", "\xe9\xe8"]):
        value = message["payload"]["after"]["dataColumn"]["t"]
        assert value == text
        assert _utf8_pointer(value, offset) is not None
        assert ctypes.string_at(_utf8_pointer(value, offset)) == text.encode()
