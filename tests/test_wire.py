"""Envelope framing (split, pack, reassemble) and the `.pb` / dts-json streams (proto/subscribe.proto; docs/cli.md, "File formats")."""
import gc
import io
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.errors import DecodeError, FramingError
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import (
    Assembled,
    Reassembler,
    encode_varint,
    entry_from_json_line,
    entry_to_json_line,
    iter_pb_messages,
    pack_entries,
    read_dts_json,
    read_pb,
    split_entries,
    write_dts_json,
    write_pb,
)
from support.strategies import dml_entries, entries, entry_streams, envelope_streams
from support.wire_spec import varint

DEFAULT_MAX = 1 << 20
max_sizes = st.one_of(st.none(), st.integers(64, 4096))
PARTITION = 5


def limit_kwargs(max_size):
    return {} if max_size is None else {"max_message_bytes": max_size}


def raw(env) -> bytes:
    return env if isinstance(env, (bytes, bytearray)) else env.SerializeToString()


def feed_all(reassembler, envelopes, partition=PARTITION, first_offset=100) -> list:
    out = []
    for offset, env in enumerate(envelopes, first_offset):
        out.extend(reassembler.feed(partition, offset, raw(env)))
    return out


def assembled(results) -> list[Assembled]:
    return [r for r in results if isinstance(r, Assembled)]


def errors(results) -> list:
    return [r for r in results if not isinstance(r, Assembled)]


def items(results) -> list[bytes]:
    return [e.SerializeToString() for a in assembled(results) for e in a.entries.items]


def serialized(entry_list) -> list[bytes]:
    return [e.SerializeToString() for e in entry_list]



# ---- split and pack ------------------------------------------------------------------------

@given(st.binary(max_size=5000), max_sizes)
def test_split_cuts_any_bytes_into_numbered_segments_within_the_limit(data, max_size):
    envs = split_entries(data, **limit_kwargs(max_size))
    limit = max_size or DEFAULT_MAX
    assert b"".join(env.data for env in envs) == data
    assert [(env.version, env.total, env.index) for env in envs] == [(1, len(envs), i) for i in range(len(envs))]
    assert all(env.ByteSize() <= limit for env in envs)
    assert len(envs) == 1 or all(env.data for env in envs)


def test_split_rejects_a_limit_too_small_for_the_envelope_itself():
    with pytest.raises(ValueError):
        split_entries(b"x" * 100, max_message_bytes=24)


@given(st.lists(entries(), max_size=4), max_sizes)
def test_split_then_reassemble_gives_back_the_entries_bytes(entry_list, max_size):
    data = pb.Entries(items=entry_list).SerializeToString()
    envs = split_entries(data, **limit_kwargs(max_size))
    results = feed_all(Reassembler(), envs)
    assert errors(results) == []
    [whole] = assembled(results)
    assert whole.entries.SerializeToString() == data
    assert (whole.partition, whole.first_offset, whole.last_offset, whole.segments) == \
        (PARTITION, 100, 100 + len(envs) - 1, len(envs))


def test_an_entries_over_the_default_limit_travels_in_segments():
    entry = pb.Entry(header=pb.Header(version=1, messageType=pb.DML, seqId=9))
    entry.event.dmlEvent.rows.add().newColumns.add(dataType=pb.BYTES, bv=bytes(range(256)) * 10_000)
    data = pb.Entries(items=[entry]).SerializeToString()
    envs = split_entries(data)
    assert len(envs) == 3 and all(env.ByteSize() <= DEFAULT_MAX for env in envs)
    [whole] = feed_all(Reassembler(), envs)
    assert whole.entries.items[0] == entry


@given(entry_streams(max_size=10), max_sizes)
def test_pack_entries_reassembles_to_the_same_entries_in_order(entry_list, max_size):
    envs = list(pack_entries(entry_list, **limit_kwargs(max_size)))
    limit = max_size or DEFAULT_MAX
    assert all(env.ByteSize() <= limit and env.version == 1 for env in envs)
    r = Reassembler()
    results = feed_all(r, envs)
    assert errors(results) == [] and r.finish() == []
    assert items(results) == serialized(entry_list)
    for whole in assembled(results):
        # merging stops at the limit; only an Entry too large alone is cut into segments
        assert whole.segments == 1 or len(whole.entries.items) == 1


def test_pack_entries_merges_small_entries_into_one_message():
    entry_list = [pb.Entry(header=pb.Header(version=1, seqId=i)) for i in range(50)]
    envs = list(pack_entries(entry_list))
    assert len(envs) == 1
    assert pb.Entries.FromString(envs[0].data).items == entry_list


@given(envelope_streams())
def test_reassembler_reads_independently_framed_streams(stream):
    entry_list, envs = stream
    r = Reassembler()
    results = feed_all(r, envs)
    assert errors(results) == [] and r.finish() == []
    assert items(results) == serialized(entry_list)
    assert sum(a.segments for a in assembled(results)) == len(envs)


# ---- framing errors ------------------------------------------------------------------------

@pytest.fixture
def segments() -> list[pb.Envelope]:
    entry = pb.Entry(header=pb.Header(version=1, messageType=pb.DML, seqId=1))
    entry.event.dmlEvent.rows.add().newColumns.add(dataType=pb.BYTES, bv=b"\x01" * 200)
    envs = split_entries(pb.Entries(items=[entry]).SerializeToString(), max_message_bytes=100)
    assert len(envs) == 3
    return envs


def single(data: bytes = b"", **fields) -> pb.Envelope:
    env = pb.Envelope(version=1, total=1, index=0, data=data)
    for name, value in fields.items():
        setattr(env, name, value)
    return env


def check_error(err, cls, offset, count, words=()):
    assert isinstance(err, cls), err
    assert err.where["partition"] == PARTITION and err.where["offset"] == offset
    assert f"partition {PARTITION}" in str(err) and f"offset {offset}" in str(err)
    assert err.count == count
    for word in words:
        assert word in str(err)


def test_reordered_segments_are_reported(segments):
    s0, s1, s2 = segments
    results = feed_all(Reassembler(), [s0, s2, s1])
    assert assembled(results) == []
    gap, orphan = results
    check_error(gap, FramingError, 101, 2, ["missing", "expected index 1"])
    check_error(orphan, FramingError, 102, 1, ["without its first"])


def test_a_missing_segment_is_reported(segments):
    r = Reassembler()
    [gap] = feed_all(r, [segments[0], segments[2]])
    check_error(gap, FramingError, 101, 2, ["missing"])
    assert r.finish() == []


def test_a_duplicated_segment_is_reported(segments):
    s0, s1, s2 = segments
    results = feed_all(Reassembler(), [s0, s1, s1, s2])
    dup, orphan = results
    check_error(dup, FramingError, 102, 3, ["duplicated"])
    check_error(orphan, FramingError, 103, 1)


def test_a_foreign_segment_of_a_different_total_is_reported(segments):
    foreign = pb.Envelope(version=1, total=2, index=1, data=b"\x0a")
    [err] = feed_all(Reassembler(), [segments[0], foreign])
    check_error(err, FramingError, 101, 2, ["different total"])


def test_an_offset_not_after_the_previous_one_is_reported(segments):
    r = Reassembler()
    assert r.feed(PARTITION, 100, raw(segments[0])) == []
    [back] = r.feed(PARTITION, 99, raw(segments[1]))
    check_error(back, FramingError, 99, 1, ["offset not after"])
    [same] = r.feed(PARTITION, 100, raw(segments[1]))
    check_error(same, FramingError, 100, 1)
    # the buffer is still open and continues with the next offsets
    assert len(assembled(r.feed(PARTITION, 101, raw(segments[1])) + r.feed(PARTITION, 102, raw(segments[2])))) == 1


@pytest.mark.parametrize("env, words", [
    (single(version=2), ["version 2"]),
    (single(version=0), ["version 0"]),
    (single(total=0), ["total is 0"]),
    (single(total=3, index=3), ["index 3", "total 3"]),
    (single(total=2, index=1), ["without its first"]),
], ids=["version-2", "no-version", "total-0", "index-not-below-total", "no-first-segment"])
def test_bad_envelope_headers_are_reported(env, words):
    r = Reassembler()
    [err] = feed_all(r, [env])
    check_error(err, FramingError, 100, 1, words)
    assert r.open_partitions == []


def test_a_new_first_segment_while_a_buffer_is_open_is_reported_and_starts_over(segments):
    whole = single(pb.Entries(items=[pb.Entry(header=pb.Header(seqId=4))]).SerializeToString())
    results = feed_all(Reassembler(), [segments[0], segments[1], whole])
    err, done = results
    check_error(err, FramingError, 102, 2, ["new first segment"])
    assert isinstance(done, Assembled) and done.entries.items[0].header.seqId == 4


@pytest.mark.parametrize("envs", [
    [single(b"\x0a\xff")],
    [pb.Envelope(version=1, total=2, index=0, data=b"\x0a\x05ab"),
     pb.Envelope(version=1, total=2, index=1, data=b"c")],
], ids=["one-segment", "two-segments"])
def test_a_buffer_that_does_not_parse_as_entries_is_reported(envs):
    results = feed_all(Reassembler(), envs)
    [err] = results
    check_error(err, DecodeError, 100 + len(envs) - 1, len(envs), ["Entries"])
    assert err.where["first_offset"] == 100


@pytest.mark.parametrize("value", [b"\xff\xff\xff", b"\x22\x05ab", b"\x08"], ids=["bad-tag", "short-data", "short-varint"])
def test_garbage_bytes_are_reported(value):
    [err] = feed_all(Reassembler(), [value])
    check_error(err, DecodeError, 100, 1, ["not an Envelope"])


@given(st.lists(st.binary(max_size=40), max_size=8))
def test_any_bytes_give_results_or_errors_never_exceptions(values):
    r = Reassembler()
    results = feed_all(r, values) + r.finish()
    assert sum(a.segments for a in assembled(results)) + sum(e.count for e in errors(results)) == len(values)
    for err in errors(results):
        assert isinstance(err, (FramingError, DecodeError)) and err.where["partition"] == PARTITION


# Mutations of a well-formed stream: drop, duplicate, swap, garbage, foreign segment, bad version.
mutation = st.tuples(st.sampled_from(["drop", "dup", "swap", "garbage", "foreign", "version", "offset"]),
                     st.integers(0, 1000))


def mutate(values: list[bytes], ops) -> list[tuple[int, bytes]]:
    values = list(values)
    back = set()
    for op, n in ops:
        i = n % (len(values) + 1)
        if op == "drop" and values:
            del values[i % len(values)]
        elif op == "dup" and values:
            values.insert(i, values[i % len(values)])
        elif op == "swap" and len(values) > 1:
            j = i % (len(values) - 1)
            values[j], values[j + 1] = values[j + 1], values[j]
        elif op == "garbage":
            values.insert(i, b"\xff" + bytes([n % 256]))
        elif op == "foreign":
            values.insert(i, pb.Envelope(version=1, total=7, index=n % 7, data=b"\x0a\x00").SerializeToString())
        elif op == "version":
            values.insert(i, pb.Envelope(version=n % 5 + 2, total=1).SerializeToString())
        elif op == "offset":
            back.add(i)
    offsets, offset = [], 1000
    for i in range(len(values)):
        offset += -3 if i in back else 1
        offsets.append(offset)
    return list(zip(offsets, values))


@given(envelope_streams(max_size=128), st.lists(mutation, max_size=4))
def test_every_input_envelope_is_accounted_for(stream, ops):
    _, envs = stream
    fed = mutate([raw(e) for e in envs], ops)
    r = Reassembler()
    results = [out for offset, value in fed for out in r.feed(PARTITION, offset, value)]
    unfinished = r.finish()
    converted = sum(a.segments for a in assembled(results))
    rejected = sum(e.count for e in errors(results)) + sum(e.count for e in unfinished)
    assert converted + rejected == len(fed)
    for err in errors(results) + unfinished:
        assert isinstance(err, (FramingError, DecodeError))
        assert err.where["partition"] == PARTITION and err.where["offset"] in {o for o, _ in fed}


@given(envelope_streams(max_size=96), envelope_streams(max_size=200), st.data())
def test_interleaved_partitions_reassemble_independently(a, b, data):
    (entries_a, envs_a), (entries_b, envs_b) = a, b
    order = data.draw(st.permutations([0] * len(envs_a) + [1] * len(envs_b)))
    queues = [iter(envs_a), iter(envs_b)]
    partitions = ["orders", 3]
    offsets = [0, 0]
    r = Reassembler()
    results = []
    for which in order:
        offsets[which] += 1
        results.extend(r.feed(partitions[which], offsets[which], raw(next(queues[which]))))
    assert errors(results) == [] and r.finish() == []
    for which, expected in ((0, entries_a), (1, entries_b)):
        mine = [a for a in assembled(results) if a.partition == partitions[which]]
        assert [e.SerializeToString() for a in mine for e in a.entries.items] == serialized(expected)


def test_finish_reports_unfinished_buffers(segments):
    r = Reassembler()
    feed_all(r, segments[:2], partition=PARTITION, first_offset=100)
    feed_all(r, segments[:1], partition=9, first_offset=7)
    assert r.open_partitions == sorted([PARTITION, 9], key=repr)
    reported = {err.where["partition"]: err for err in r.finish()}
    check_error(reported[PARTITION], FramingError, 100, 2, ["unfinished", "2 of 3"])
    assert reported[9].where["offset"] == 7 and reported[9].count == 1
    assert r.finish() == [] and r.open_partitions == []


# ---- .pb streams ---------------------------------------------------------------------------

@given(envelope_streams())
def test_pb_stream_write_read_round_trip(stream):
    _, envs = stream
    out = io.BytesIO()
    assert write_pb(out, envs) == len(envs)
    positions = list(itertools.accumulate((len(varint(e.ByteSize())) + e.ByteSize() for e in envs), initial=0))
    got = list(read_pb(io.BytesIO(out.getvalue())))
    assert got == [(i, positions[i], raw(env)) for i, env in enumerate(envs)]
    assert positions[-1] == len(out.getvalue())


def test_pb_file_round_trip_with_bytes_and_messages(tmp_path):
    path = tmp_path / "x.pb"
    envs = [single(b"a" * 300), single(b"")]
    with open(path, "wb") as fh:
        assert write_pb(fh, [envs[0], raw(envs[1])]) == 2
    assert [body for _, _, body in read_pb(path)] == [raw(e) for e in envs]
    assert [body for _, _, body in read_pb(str(path))] == [raw(e) for e in envs]


def pb_bytes(*envs) -> bytes:
    return b"".join(varint(len(raw(e))) + raw(e) for e in envs)


def read_all(data: bytes, source="in.pb"):
    return list(iter_pb_messages(io.BytesIO(data), source))


@pytest.mark.parametrize("tail, reason", [
    (b"\x80", "truncated length prefix"),
    (b"\xff\xff", "truncated length prefix"),
    (varint(10) + b"12345", "truncated message: 5 of 10"),
    (b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
    (varint(1 << 40) + b"x", "2 GiB"),
    (varint((1 << 31) - 1) + b"abc", "truncated message: 3 of 2147483647"),
], ids=["prefix-1", "prefix-2", "body", "overlong-prefix", "huge-length", "big-truncated"])
def test_truncated_or_bogus_pb_streams_name_message_and_byte(tail, reason):
    first = single(b"hello")
    head = pb_bytes(first)
    with pytest.raises(DecodeError) as info:
        read_all(head + tail)
    err = info.value
    assert reason in err.reason
    assert err.where == {"message": 1, "byte": len(head), "source": "in.pb"}
    assert f"message 1, byte {len(head)}" in str(err)


@given(st.binary(max_size=200))
def test_any_bytes_read_as_messages_or_a_decode_error(data):
    try:
        got = read_all(data)
    except DecodeError as err:
        assert 0 <= err.where["byte"] < len(data)
    else:
        assert b"".join(varint(len(body)) + body for _, _, body in got) == data


class GeneratorStream(io.RawIOBase):
    """An unbuffered stream fed by a generator of chunks (a socket, a pipe, a Kafka dump...)."""

    def __init__(self, chunks):
        self.chunks = iter(chunks)
        self.pending = b""
        self.pulled = 0

    def readable(self):
        return True

    def readinto(self, buffer):
        while not self.pending:
            self.pending = next(self.chunks, b"")
            if not self.pending:
                return 0
            self.pulled += 1
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def test_reading_pb_is_streaming_not_whole_file():
    message = pb_bytes(single(b"x" * 1000))
    stream = GeneratorStream(itertools.repeat(message))  # endless
    got = list(itertools.islice(read_pb(stream), 5))
    assert [n for n, _, _ in got] == [0, 1, 2, 3, 4]
    assert stream.pulled < 50


def test_reading_pb_leaves_the_callers_raw_stream_open():
    stream = GeneratorStream([pb_bytes(single(b"a"), single(b"b"))])
    assert len(list(read_pb(stream))) == 2
    gc.collect()
    assert not stream.closed


class ShortReads:
    """Only `read`, returning at most 3 bytes a call, as some sockets and HTTP bodies do."""

    def __init__(self, data: bytes):
        self.data = data

    def read(self, size=-1):
        size = 3 if size < 0 else min(size, 3)
        out, self.data = self.data[:size], self.data[size:]
        return out


def test_reading_pb_from_a_duck_typed_stream_with_short_reads():
    envs = [single(b"y" * 500), single(b"z")]
    assert [body for _, _, body in read_pb(ShortReads(pb_bytes(*envs)))] == [raw(e) for e in envs]


def test_encode_varint_matches_protobuf():
    for n in [0, 1, 127, 128, 300, 2**31, 2**64 - 1]:
        assert encode_varint(n) == varint(n)
    assert pb.Envelope(total=2**32 - 1).SerializeToString() == b"\x10" + encode_varint(2**32 - 1)


# ---- dts-json ------------------------------------------------------------------------------

@given(entry_streams())
def test_dts_json_write_read_round_trip(entry_list):
    out = io.BytesIO()
    assert write_dts_json(out, entry_list) == len(entry_list)
    text = out.getvalue()
    assert text.count(b"\n") == len(entry_list)
    lines = list(read_dts_json(io.BytesIO(text)))
    assert [n for n, _ in lines] == list(range(1, len(entry_list) + 1))
    back = [entry_from_json_line(line, n) for n, line in lines]
    assert serialized(back) == serialized(entry_list)


def test_dts_json_is_protobufs_canonical_json_mapping():
    entry = pb.Entry(header=pb.Header(version=1, messageType=pb.ROLLBACK, seqId=2**64 - 1))
    entry.event.rollbackEvent.SetInParent()
    assert entry_to_json_line(entry) == \
        b'{"header":{"version":1,"messageType":"ROLLBACK","seqId":"18446744073709551615"},' \
        b'"event":{"rollbackEvent":{}}}\n'
    assert entry_from_json_line(entry_to_json_line(entry)) == entry


def test_dts_json_keeps_unknown_enum_numbers():
    entry = pb.Entry(header=pb.Header(messageType=99))
    entry.event.dmlEvent.rows.add().newColumns.add(dataType=42, sv="1")
    assert entry_from_json_line(entry_to_json_line(entry)) == entry


def test_dts_json_file_round_trip_skips_blank_lines(tmp_path):
    entry_list = [pb.Entry(header=pb.Header(seqId=i)) for i in range(3)]
    path = tmp_path / "x.jsonl"
    with open(path, "wb") as fh:
        write_dts_json(fh, entry_list[:2])
        fh.write(b"\n   \n")
        write_dts_json(fh, entry_list[2:])
    lines = list(read_dts_json(path))
    assert [n for n, _ in lines] == [1, 2, 5]
    assert [entry_from_json_line(line, n) for n, line in lines] == entry_list


@pytest.mark.parametrize("bad, reason", [
    (b"{not json", "invalid JSON"),
    (b'{"header": {"seqId": 1}', "invalid JSON"),
    (b"\xff\xfe", "invalid JSON"),
    (b'{"foo": 1}', "not an Entry"),
    (b"[1, 2]", "not an Entry"),
    (b'"text"', "not an Entry"),
    (b"42", "not an Entry"),
    (b"null", "not an Entry"),
    (b'{"header": 5}', "not an Entry"),
    (b'{"header": {"seqId": "x"}}', "not an Entry"),
    (b'{"header": {"seqId": "18446744073709551616"}}', "not an Entry"),
    (b'{"header": {"messageType": "NOPE"}}', "not an Entry"),
])
def test_bad_dts_json_lines_name_their_line(bad, reason):
    good = entry_to_json_line(pb.Entry(header=pb.Header(seqId=1)))
    stream = io.BytesIO(good + b"\n" + bad + b"\n" + good)
    lines = list(read_dts_json(stream, source="in.jsonl"))
    assert [n for n, _ in lines] == [1, 3, 4]
    entry_from_json_line(lines[0][1], 1)
    with pytest.raises(DecodeError) as info:
        entry_from_json_line(lines[1][1], lines[1][0], source="in.jsonl")
    err = info.value
    assert reason in err.reason
    assert err.where["line"] == 3 and err.where["source"] == "in.jsonl"
    assert "line 3" in str(err)


@given(dml_entries())
def test_dts_json_lines_are_single_lines(entry):
    line = entry_to_json_line(entry)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert entry_from_json_line(line.decode("utf-8")) == entry


# ---- TDSQL's Kafka headers: ShardId and ps --------------------------------------------------------

def _tdsql_entries(seq: int, size: int) -> bytes:
    items = [pb.Entry(header=pb.Header(seqId=seq * 100 + i, tableName="t" * size)) for i in range(3)]
    return pb.Entries(items=items).SerializeToString()


def _feed_all(reassembler, records):
    out = []
    for offset, (value, headers) in enumerate(records):
        out.extend(reassembler.feed(0, offset, value, headers))
    return out


def _segments(seq: int, shard: str, first_ps: int):
    envs = split_entries(_tdsql_entries(seq, 60), max_message_bytes=120)
    assert len(envs) >= 3
    return [(env.SerializeToString(), [("ShardId", shard.encode()), ("ps", str(first_ps + i).encode())])
            for i, env in enumerate(envs)]


def test_tdsql_shards_interleaved_in_one_partition_reassemble_each_and_come_out_in_first_segment_order():
    a, b = _segments(1, "s1", 1), _segments(2, "s2", 1)
    records = [a[0], b[0]] + [x for pair in zip(a[1:], b[1:]) for x in pair] + a[len(b):] + b[len(a):]
    r = Reassembler()
    out = _feed_all(r, records)
    assert [type(x) for x in out] == [Assembled, Assembled]
    assert [x.first_offset for x in out] == [0, 1]  # a started first: it comes first, even if b completed first
    assert [[e.header.seqId for e in x.entries.items] for x in out] == [[100, 101, 102], [200, 201, 202]]
    assert r.held_from(0) is None and r.held_segments() == 0


def test_tdsql_a_complete_entries_waits_behind_an_earlier_open_one_and_holds_the_commit_point():
    a, b = _segments(1, "s1", 1), _segments(2, "s2", 1)
    r = Reassembler()
    out = _feed_all(r, [a[0]] + b)  # b complete while a is open
    assert out == []
    assert r.held_from(0) == 0 and r.held_segments() == 1 + len(b)
    out = [x for i, rec in enumerate(a[1:], 1 + len(b)) for x in r.feed(0, i, *rec)]
    assert [x.first_offset for x in out] == [0, 1]


def test_tdsql_redelivered_ps_is_dropped_and_counted():
    from bridge.stream import ErrorPolicy, dts_records_to_entries
    a = _segments(1, "s1", 1)
    records = [(0, i, value, headers) for i, (value, headers) in enumerate(a)]
    records.insert(2, (0, 2, a[1][0], a[1][1]))  # segment 1 again, same ps
    records = [(p, i, v, h) for i, (p, _, v, h) in enumerate(records)]
    policy = ErrorPolicy("fail")
    got = [entry.header.seqId for _, entry in dts_records_to_entries(records, policy)]
    assert got == [100, 101, 102]
    assert policy.tally.redelivered == 1 and policy.tally.input == 3 and policy.tally.rejected == 0


def test_tdsql_ps_gap_is_an_error_naming_partition_shard_and_both_numbers():
    from bridge.stream import ErrorPolicy, dts_records_to_entries
    a, b = _segments(1, "s1", 1), _segments(2, "s1", 100)  # ps jumps from len(a) to 100
    records = [(0, i, v, h) for i, (v, h) in enumerate(a + b)]
    with pytest.raises(FramingError) as caught:
        list(dts_records_to_entries(records, ErrorPolicy("fail")))
    err = caught.value
    assert err.where["partition"] == 0 and err.where["shard"] == "s1"
    assert (err.where["last_ps"], err.where["ps"]) == (len(a), 100) and "lost" in str(err)
    policy = ErrorPolicy("skip")
    got = [entry.header.seqId for _, entry in dts_records_to_entries(records, policy)]
    assert got == [100, 101, 102, 200, 201, 202]  # both Entries were whole; the gap lost other records
    lost = 100 - len(a) - 1
    assert [r["shard"] for r in policy.rejects] == ["s1"]
    assert policy.tally.input == 6 + lost and policy.tally.rejected == lost  # the lost records, counted


def test_tdsql_gap_inside_an_open_entries_abandons_it():
    from bridge.stream import ErrorPolicy, dts_records_to_entries
    a = _segments(1, "s1", 1)
    broken = [a[0], (a[1][0], [("ShardId", b"s1"), ("ps", b"7")])]
    records = [(0, i, v, h) for i, (v, h) in enumerate(broken)]
    policy = ErrorPolicy("skip")
    assert list(dts_records_to_entries(records, policy)) == []
    reasons = [r["reason"] for r in policy.rejects]
    assert any("ps jumps from 1 to 7" in x for x in reasons) and any("lost segments" in x for x in reasons)
    # the 5 records lost in the gap, the abandoned segment and the orphan after it
    assert policy.tally.input == policy.tally.rejected == 7


def test_records_without_tdsql_headers_behave_as_before():
    a = _segments(1, "s1", 1)
    r = Reassembler()
    out = [x for i, (value, _) in enumerate(a) for x in r.feed(0, i, value, [("other", b"x")])]
    assert [x.first_offset for x in out] == [0]


def test_tdsql_resumed_at_a_commit_the_tails_of_entries_handed_out_before_it_are_dropped_and_counted():
    from bridge.stream import ErrorPolicy, dts_records_to_entries
    a, b = _segments(1, "s1", 1), _segments(2, "s2", 1)
    # offsets: a0 b0 a1 b1 a2 b2 ...: a completes first; a commit then stops at b's first segment (1)
    records = [x for pair in zip(a, b) for x in pair]
    r = Reassembler()
    out = [x for i, (v, h) in enumerate(records) for x in r.feed(0, i, v, h)]
    assert [x.first_offset for x in out] == [0, 1]
    # a restart at offset 1 reads b whole again and a's later segments without their first
    again = [(0, i, v, h) for i, (v, h) in enumerate(records) if i >= 1]
    fresh = Reassembler()
    fresh.resume_at(0)
    policy = ErrorPolicy("fail")
    got = [entry.header.seqId for _, entry in dts_records_to_entries(again, policy, fresh)]
    assert got == [200, 201, 202]
    assert policy.tally.resumed_tails == len(a) - 1 and policy.tally.rejected == 0
    # without resume_at the same records are framing errors
    with pytest.raises(FramingError, match="without its first segment"):
        list(dts_records_to_entries(again, ErrorPolicy("fail")))
