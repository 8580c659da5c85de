"""The C reading of a Blob GetRecords answer (`_speedups.blob_page`, bridge/native/src/pages.c)
against its reference: protobuf's own parse (`prefetch._rows_of`) and `_records_of`'s loop.

Answers are written at the wire level, so that what protobuf allows and a plain serializer never
writes is there too: fields in any order and repeated (the last scalar wins, the singular messages
`attributes` and `data` merge), unknown fields of every wire type, known fields of another wire
type, groups, text that is not UTF-8, records without data, negative and 10-byte varints, truncated
bytes. Wherever C answers it must give the reference's records, value for value and type for type;
where it is not sure it says None (the source then takes the reference path); and for the answers
a DataHub server writes it must be sure.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.datahub.prefetch import _pb_response_class, _RawPage, _rows_of
from bridge.stream.shards import DataHubRecord
from bridge.wire.framing import encode_varint

speedups = pytest.importorskip("bridge.native._speedups")
blob_page = speedups.blob_page

KEY, TOPIC, SHARD = ("blobs", "1"), "blobs", "1"


def varint(v: int) -> bytes:
    return encode_varint(v & ((1 << 64) - 1))  # (a negative int64 as protobuf writes it: 10 bytes)


def tag(field: int, wt: int) -> bytes:
    return varint(field << 3 | wt)


def ld(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + varint(len(payload)) + payload


def reference(pb: bytes, next_: int, now: float):
    """What the reader made of the answer before pages.c: ("error", type) when protobuf or
    `_rows_of` raise."""
    try:
        rows, cursor, _ = _rows_of(pb, None)
    except Exception as exc:  # noqa: BLE001 (what the reference raises is the point)
        return ("error", type(exc))
    out = [(KEY, seq, DataHubRecord(TOPIC, SHARD, seq, t, a, d, None, None, now), a)
           for seq, t, a, d in rows if seq >= next_]
    return out, cursor, len(rows)


def same(got, want) -> None:
    """Equal, and of the same types all the way down (a str key is not a bytes key)."""
    out, cursor, count = got
    w_out, w_cursor, w_count = want
    assert (cursor, type(cursor), count) == (w_cursor, type(w_cursor), w_count)
    assert len(out) == len(w_out)
    for (k, seq, rec, attrs), (wk, wseq, wrec, wattrs) in zip(out, w_out):
        assert (k, seq, type(seq)) == (wk, wseq, type(wseq))
        assert rec == wrec and type(rec.data) is bytes and type(rec.sequence) is int
        assert list(attrs.items()) == list(wattrs.items())
        assert [type(x) for kv in attrs.items() for x in kv] == [type(x) for kv in wattrs.items() for x in kv]
        assert rec.attributes is attrs  # one dict, as `_records_of` hands it on


# -- answers at the wire level ----------------------------------------------------------------------

text = st.one_of(st.text(max_size=12).map(str.encode),
                 st.sampled_from([b"dts.topic", b"dts.pos", b"bench-dts", b"0:12:0:3"]),
                 st.binary(max_size=6))  # (mostly not UTF-8)
unknown = st.one_of(
    st.tuples(st.integers(10, 40), st.integers(0, 2**64 - 1)).map(lambda f: tag(f[0], 0) + varint(f[1])),
    st.tuples(st.integers(10, 40), st.binary(min_size=8, max_size=8)).map(lambda f: tag(f[0], 1) + f[1]),
    st.tuples(st.integers(10, 40), st.binary(max_size=5)).map(lambda f: ld(f[0], f[1])),
    st.tuples(st.integers(10, 40), st.binary(min_size=4, max_size=4)).map(lambda f: tag(f[0], 5) + f[1]),
)
odd_unknown = st.one_of(unknown, st.integers(10, 40).map(lambda f: tag(f, 3) + tag(f, 4)))  # an empty group


@st.composite
def pair(draw, plain: bool) -> bytes:
    parts = []
    if draw(st.booleans()) or plain:
        parts.append(ld(1, draw(text if not plain else st.text(max_size=10).map(str.encode))))
    if draw(st.booleans()) or plain:
        parts.append(ld(2, draw(text if not plain else st.text(max_size=10).map(str.encode))))
    if not plain:
        parts += draw(st.lists(odd_unknown, max_size=1))
        if draw(st.integers(0, 9)) == 0:
            parts.append(ld(1, draw(text)))  # the key again: the last wins
        parts = draw(st.permutations(parts))
    return b"".join(parts)


@st.composite
def entry(draw, plain: bool) -> bytes:
    """A RecordEntry: strings 1-5 (shard, hash key, partition key, cursor, next cursor), sequence 6,
    system time 7, attributes 8 (StringPairs), data 9 (FieldData values)."""
    parts = [ld(f, draw(st.text(max_size=6)).encode()) for f in range(1, 6) if draw(st.booleans())]
    ints = st.integers(0, 2**40) if plain else st.integers(-(2**63), 2**64 - 1)
    parts.append(tag(6, 0) + varint(draw(ints)))
    parts.append(tag(7, 0) + varint(draw(ints)))
    pairs = [draw(pair(plain)) for _ in range(draw(st.integers(0, 3)))]
    if plain:
        parts.append(ld(8, b"".join(ld(1, p) for p in pairs)))
        parts.append(ld(9, ld(1, ld(1, draw(st.binary(max_size=40))))))
    else:
        cut = draw(st.integers(0, len(pairs)))  # attributes written in two messages: merged
        parts.append(ld(8, b"".join(ld(1, p) for p in pairs[:cut])))
        if cut < len(pairs) or draw(st.booleans()):
            parts.append(ld(8, b"".join(ld(1, p) for p in pairs[cut:])))
        datas = [b"".join(ld(1, v) for v in draw(st.lists(st.binary(max_size=10), max_size=2)))
                 for _ in range(draw(st.integers(0, 3)))]  # FieldData with 0-2 values (the last wins)
        groups = draw(st.lists(st.lists(st.sampled_from(range(len(datas))), max_size=2), max_size=2)) if datas \
            else draw(st.lists(st.just([]), max_size=2))
        for group in groups or [list(range(len(datas)))]:
            parts.append(ld(9, b"".join(ld(1, datas[i]) for i in group)))
        if draw(st.integers(0, 5)) == 0:
            parts.append(tag(6, 0) + varint(draw(ints)))  # the sequence again: the last wins
        if draw(st.integers(0, 7)) == 0:
            parts.append(ld(6, b"\x01"))  # the sequence of another wire type: an unknown field
        parts += draw(st.lists(odd_unknown, max_size=2))
        parts = draw(st.permutations(parts))
    return b"".join(parts)


@st.composite
def answer(draw, plain: bool = False) -> bytes:
    parts = [ld(4, draw(entry(plain))) for _ in range(draw(st.integers(0, 6)))]
    parts.append(ld(1, draw(st.text(max_size=20).map(str.encode) if plain else text)))
    parts.append(tag(2, 0) + varint(len(parts)))  # record_count
    parts.append(tag(3, 0) + varint(draw(st.integers(0, 2**40))))  # start_sequence
    if not plain:
        if draw(st.integers(0, 4)) == 0:
            parts.append(ld(1, draw(text)))  # the next cursor again: the last wins
        parts += draw(st.lists(odd_unknown, max_size=2))
        parts = draw(st.permutations(parts))
    pb = b"".join(parts)
    if not plain and draw(st.integers(0, 9)) == 0:
        pb = pb[:draw(st.integers(0, max(len(pb) - 1, 0)))]  # truncated
    return pb


@settings(max_examples=400)
@given(answer(), st.integers(-3, 2**40), st.floats(0, 1e6))
def test_any_answer_gives_the_reference_records_or_none(pb, next_, now):
    got = blob_page(pb, KEY, TOPIC, SHARD, next_, now, DataHubRecord)
    want = reference(pb, next_, now)
    if got is not None:
        assert want[0] != "error", f"C answered where the reference raises {want[1]}"
        same(got, want)


@settings(max_examples=300)
@given(answer(plain=True), st.integers(0, 2**40), st.floats(0, 1e6))
def test_plain_answers_are_read_in_c(pb, next_, now):
    got = blob_page(pb, KEY, TOPIC, SHARD, next_, now, DataHubRecord)
    assert got is not None
    same(got, reference(pb, next_, now))


def _served(records: int = 3, **edit) -> bytes:
    """An answer as protobuf serializes one (pydatahub's fields)."""
    m = _pb_response_class()()
    m.next_cursor = "next-cursor"
    for i in range(records):
        r = m.records.add()
        r.sequence, r.system_time = 100 + i, 1_700_000_000_000 + i
        for k, v in (("dts.topic", "bench-dts"), ("dts.pos", f"0:{i}:0:0")):
            a = r.attributes.attributes.add()
            a.key, a.value = k, v
        r.data.data.add().value = b'{"payload":%d}' % i
    for name, value in edit.items():
        setattr(m.records[0], name, value)
    return m.SerializeToString()


def test_a_served_answer_and_its_position():
    pb = _served()
    for next_ in (0, 100, 101, 102, 103, 500):
        got = blob_page(pb, KEY, TOPIC, SHARD, next_, 2.5, DataHubRecord)
        same(got, reference(pb, next_, 2.5))
        assert [r[1] for r in got[0]] == [s for s in (100, 101, 102) if s >= next_] and got[2] == 3
    out = blob_page(pb, KEY, TOPIC, SHARD, 0, 2.5, DataHubRecord)[0]
    # repeated texts are one object (as `_rows_of` shares them), a record's own are its own
    assert out[0][3]["dts.topic"] is out[2][3]["dts.topic"]
    assert list(out[0][3])[0] is list(out[1][3])[0]


@pytest.mark.parametrize("pb", [
    b"\x22\x02\x30",  # a record cut inside its sequence
    ld(4, tag(6, 0) + b"\x01"),  # a record without data: `data.data[0]` raises in the reference
    ld(4, tag(6, 0) + b"\x01" + ld(9, b"")),  # data without a FieldData
    ld(4, tag(6, 0) + b"\x01" + ld(8, ld(1, ld(1, b"\xff"))) + ld(9, ld(1, b""))),  # a key that is not UTF-8
    ld(1, b"\xed\xa0\x80"),  # a cursor that is a surrogate, not UTF-8
    tag(5, 3) + tag(5, 4),  # a group
])
def test_what_c_is_not_sure_of_goes_the_reference_way(pb):
    assert blob_page(pb, KEY, TOPIC, SHARD, 0, 1.0, DataHubRecord) is None
    page = _RawPage(pb, "Tue, 01 Dec 2026 10:00:00 GMT")
    want = reference(pb, 0, 1.0)
    if want[0] == "error":
        with pytest.raises(want[1]):
            page.take(KEY, TOPIC, SHARD, 0, 1.0, DataHubRecord)
    else:
        assert page.take(KEY, TOPIC, SHARD, 0, 1.0, DataHubRecord) is None
        assert (page.records, page.next_cursor) == _rows_of(pb, None)[:2]


def test_raw_page_take_sets_what_the_reader_reads():
    pb = _served(records=2)
    page = _RawPage(pb, None)
    out, after = page.take(KEY, TOPIC, SHARD, 101, 1.0, DataHubRecord)
    assert after == 102 and [r[1] for r in out] == [101]
    assert page.records == 2 and page.next_cursor == "next-cursor"
    empty = _RawPage(_served(records=0), None)
    assert empty.take(KEY, TOPIC, SHARD, 7, 1.0, DataHubRecord) == ([], 7) and not empty.records


def test_arguments_are_checked():
    with pytest.raises(TypeError):
        blob_page(b"", KEY, TOPIC, SHARD, 0, 1.0)
    with pytest.raises(TypeError):
        blob_page("not bytes", KEY, TOPIC, SHARD, 0, 1.0, DataHubRecord)
    with pytest.raises(TypeError):
        blob_page(b"", KEY, TOPIC, SHARD, "0", 1.0, DataHubRecord)


# -- a record's stream from its dts.pos in C (`pos_stream`, bridge/stream/shards.py's stream_of) ----

pos_part = st.one_of(st.integers(0, 10**20).map(str), st.integers(-5, 5).map(str),
                     st.sampled_from(["", "007", "-0", "--1", "²", "١٢", "1_0", " 1", "+1", "0x1", "1.5"]))
pos_text = st.one_of(st.lists(pos_part, min_size=1, max_size=5).map(":".join), st.text(max_size=12))


def _stream_or_error(rec):
    from bridge.stream.shards import stream_of
    try:
        return stream_of(rec)
    except Exception as exc:  # noqa: BLE001 (the reference's own outcome)
        return ("error", type(exc))


@settings(max_examples=500)
@given(pos_text, st.one_of(st.just("bench-dts"), st.text(max_size=4)), st.booleans())
def test_pos_stream_gives_stream_ofs_tuples(pos, source_topic, with_topic):
    from bridge.stream import shards
    attrs = {"dts.pos": pos, **({"dts.topic": source_topic} if with_topic else {})}
    rec = DataHubRecord(TOPIC, SHARD, 5, 0, attrs, data=b"{}")
    got = speedups.pos_stream(pos, TOPIC, attrs.get("dts.topic", ""))
    fast = _stream_or_error(rec)
    saved = shards._POS_STREAM
    shards._POS_STREAM = None
    try:
        slow = _stream_or_error(rec)
    finally:
        shards._POS_STREAM = saved
    assert fast == slow
    if fast[0] != "error":
        assert [type(x) for t in fast for x in t] == [type(x) for t in slow for x in t]
    if got is not None:
        assert got == slow
    if pos.count(":") == 3 and all(p.isascii() and p.isdigit() and len(p) <= 18 for p in pos.split(":")):
        assert got is not None  # the plain shape is read in C


def test_pos_stream_refuses_what_is_not_a_plain_str():
    class S(str):
        pass
    for pos in (b"1:2:3:4", S("1:2:3:4"), 1234, None):
        assert speedups.pos_stream(pos, TOPIC, "") is None
    with pytest.raises(TypeError):
        speedups.pos_stream("1:2:3:4", TOPIC)


def test_positions_outside_int64_and_other_buffers_go_the_reference_way():
    """(review of pages.c) A position past int64 (after a record at sequence 2**63 - 1) is compared
    as Python compares ints, by the reference; a buffer other than bytes could change while
    `record` runs, so it is the reference's too."""
    pb = _served()
    for next_ in (2**63, 2**70, -(2**63) - 1):
        assert blob_page(pb, KEY, TOPIC, SHARD, next_, 1.0, DataHubRecord) is None
        page = _RawPage(pb, None)
        assert page.take(KEY, TOPIC, SHARD, next_, 1.0, DataHubRecord) is None and page.records
        want = reference(pb, next_, 1.0)
        assert [r[1] for r in want[0]] == ([] if next_ > 0 else [100, 101, 102])
    for other in (bytearray(pb), memoryview(pb)):
        assert blob_page(other, KEY, TOPIC, SHARD, 0, 1.0, DataHubRecord) is None
