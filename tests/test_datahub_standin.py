"""The stand-in DataHub (tests/support/datahub_standin.py, docs/testing.md) driven by the REAL pydatahub
client over HTTP: every operation, the error codes pydatahub turns into its exceptions, and the faults.

pydatahub's JSON protocol is its default (`DataHub(id, key, endpoint)`); PutRecordsByShard only exists in
its protobuf protocol (`protocol_type=DatahubProtocolType.PB`), so those tests use a PB client.
"""
import base64
import hashlib
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest

pytest.importorskip("datahub")
pytestmark = pytest.mark.datahub

import requests  # noqa: E402
from datahub import DataHub  # noqa: E402
from datahub.core import DatahubProtocolType  # noqa: E402
from datahub.exceptions import (  # noqa: E402
    AuthorizationFailedException,
    DatahubException,
    InternalServerException,
    InvalidCursorException,
    InvalidOperationException,
    InvalidParameterException,
    LimitExceededException,
    ResourceExistException,
    ResourceNotFoundException,
    SeekOutOfRangeException,
    ShardSealedException,
)
from datahub.models import BlobRecord, CompressFormat, CursorType, FieldType, RecordSchema, ShardState, TupleRecord  # noqa: E402

from support.datahub_standin import HASH_SPACE, DataHubError, StandInDataHub  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
P = "proj"
SCHEMA = RecordSchema.from_lists(
    ["s", "n", "d", "ts", "ok", "dec", "i", "f"],
    [FieldType.STRING, FieldType.BIGINT, FieldType.DOUBLE, FieldType.TIMESTAMP, FieldType.BOOLEAN,
     FieldType.DECIMAL, FieldType.INTEGER, FieldType.FLOAT])


@pytest.fixture
def server():
    with StandInDataHub() as s:
        yield s
    assert s.errors == []  # no request hit a bug of the stand-in itself


@pytest.fixture
def client(server):
    return DataHub("test-id", "test-key", server.endpoint)  # JSON protocol, lz4 bodies


@pytest.fixture
def pb_client(server):
    return DataHub("test-id", "test-key", server.endpoint, protocol_type=DatahubProtocolType.PB)


def blob(data, shard=None, **attrs):
    r = BlobRecord(blob_data=data)
    if shard is not None:
        r.shard_id = shard
    for k, v in attrs.items():
        r.put_attribute(k, v)
    return r


def row(values, shard=None, schema=SCHEMA, **attrs):
    r = TupleRecord(schema=schema, values=values)
    if shard is not None:
        r.shard_id = shard
    for k, v in attrs.items():
        r.put_attribute(k, v)
    return r


def read_all(client, topic, shard, schema=None, limit=1000):
    cursor = client.get_cursor(P, topic, shard, CursorType.OLDEST).cursor
    got = []
    while True:
        if schema is None:
            res = client.get_blob_records(P, topic, shard, cursor, limit)
        else:
            res = client.get_tuple_records(P, topic, shard, schema, cursor, limit)
        if res.record_count == 0:
            return got
        got += res.records
        cursor = res.next_cursor


# --- projects and topics --------------------------------------------------------------------------

def test_projects(server, client):
    client.create_project("alpha", "first")
    assert client.get_project("alpha").comment == "first"
    with pytest.raises(ResourceExistException):
        client.create_project("alpha", "again")
    client.update_project("alpha", "changed")
    assert client.get_project("alpha").comment == "changed"
    assert "alpha" in client.list_project().project_names
    client.delete_project("alpha")
    assert "alpha" not in client.list_project().project_names


def test_projects_must_exist_without_auto_create():
    with StandInDataHub(auto_create_projects=False) as s:
        c = DataHub("id", "key", s.endpoint)
        with pytest.raises(ResourceNotFoundException) as e:
            c.get_project("nothere")
        assert e.value.error_code == "NoSuchProject" and e.value.status_code == 404
        with pytest.raises(ResourceNotFoundException):
            c.create_blob_topic("nothere", "t", 1, 1, "")
        c.create_project("there", "")
        c.create_blob_topic("there", "t", 1, 1, "")
        assert c.list_topic("there").topic_names == ["t"]


def test_create_get_list_delete_topics(server, client):
    client.create_blob_topic(P, "blobs", 3, 7, "a blob topic")
    client.create_tuple_topic(P, "rows", 2, 3, SCHEMA, "a tuple topic")
    assert sorted(client.list_topic(P).topic_names) == ["blobs", "rows"]
    b = client.get_topic(P, "blobs")
    assert (b.record_type.value, b.shard_count, b.life_cycle, b.comment) == ("BLOB", 3, 7, "a blob topic")
    t = client.get_topic(P, "rows")
    assert t.record_type.value == "TUPLE" and t.shard_count == 2 and t.life_cycle == 3
    assert [(f.name, f.type, f.allow_null) for f in t.record_schema.field_list] == \
        [(f.name, f.type, f.allow_null) for f in SCHEMA.field_list]
    with pytest.raises(ResourceExistException) as e:
        client.create_blob_topic(P, "blobs", 1, 1, "")
    assert e.value.error_code == "TopicAlreadyExist"
    client.update_topic(P, "blobs", 5, "new comment")
    assert client.get_topic(P, "blobs").life_cycle == 5
    client.delete_topic(P, "blobs")
    with pytest.raises(ResourceNotFoundException) as e:
        client.get_topic(P, "blobs")
    assert e.value.error_code == "NoSuchTopic"
    with pytest.raises(ResourceNotFoundException):
        client.list_shard(P, "blobs")


def test_not_null_fields_survive_get_topic(server, client):
    schema = RecordSchema.from_lists(["k", "v"], [FieldType.BIGINT, FieldType.STRING], allow_nulls=[False, True])
    client.create_tuple_topic(P, "nn", 1, 1, schema, "")
    got = client.get_topic(P, "nn").record_schema
    assert [f.allow_null for f in got.field_list] == [False, True]
    r = client.put_records(P, "nn", [row([None, "x"], "0", schema=RecordSchema.from_lists(
        ["k", "v"], [FieldType.BIGINT, FieldType.STRING]))])
    assert [f.error_code for f in r.failed_records] == ["MalformedRecord"]


def test_invalid_topic_parameters(server, client):
    with pytest.raises(InvalidParameterException):
        client.create_blob_topic(P, "zero", 0, 1, "")
    bad = RecordSchema.from_lists(["a", "A"], [FieldType.STRING, FieldType.STRING])
    with pytest.raises(InvalidParameterException):
        client.create_tuple_topic(P, "dup", 1, 1, bad, "")


def test_list_shard_hash_ranges(server, client):
    client.create_blob_topic(P, "t", 4, 1, "")
    result = client.list_shard(P, "t")
    shards = result.shards
    assert [s.shard_id for s in shards] == ["0", "1", "2", "3"]
    assert all(s.state == ShardState.ACTIVE and s.parent_shard_ids == [] for s in shards)
    assert shards[0].begin_hash_key == "0" * 32 and shards[-1].end_hash_key == "F" * 32
    for a, b in zip(shards, shards[1:]):
        assert a.end_hash_key == b.begin_hash_key
        assert a.right_shard_id == b.shard_id and b.left_shard_id == a.shard_id
    assert int(shards[1].begin_hash_key, 16) == HASH_SPACE // 4
    assert result.protocol == "http1.1" and result.interval == 500
    assert [s["shard_id"] for s in server.shards(P, "t")] == ["0", "1", "2", "3"]


# --- records ------------------------------------------------------------------------------------

@pytest.mark.parametrize("compress", [CompressFormat.LZ4, CompressFormat.ZLIB, CompressFormat.NONE])
def test_blob_round_trip_with_attributes(server, compress):
    client = DataHub("id", "key", server.endpoint, compress_format=compress)
    client.create_blob_topic(P, "t", 2, 1, "")
    payloads = [b"\x00binary\xff" * 30, "ünïcode".encode(), b"x" * 5000]
    records = [blob(p, str(i % 2), pos=str(i), src="mysql") for i, p in enumerate(payloads)]
    assert client.put_records(P, "t", records).failed_record_count == 0
    got = read_all(client, "t", "0")
    assert [r.blob_data for r in got] == [payloads[0], payloads[2]]
    assert [r.attributes for r in got] == [{"pos": "0", "src": "mysql"}, {"pos": "2", "src": "mysql"}]
    assert [r.sequence for r in got] == [0, 1]
    assert all(r.system_time > 0 for r in got)
    landed = server.records(P, "t")
    assert [(x["shard"], x["sequence"], x["data"], x["attributes"]["pos"]) for x in landed] == [
        ("0", 0, payloads[0], "0"), ("0", 1, payloads[2], "2"), ("1", 0, payloads[1], "1")]
    assert server.records(P, "t", shard="1")[0]["data"] == payloads[1]


def test_responses_are_compressed_when_accepted(server, client):
    client.create_blob_topic(P, "t", 1, 1, "")
    client.put_records(P, "t", [blob(b"y" * 4000, "0")])
    cursor = client.get_cursor(P, "t", "0", CursorType.OLDEST).cursor
    body = json.dumps({"Action": "sub", "Cursor": cursor, "Limit": 10})
    # the same request pydatahub sends, signed by pydatahub's own RestClient, seen raw
    content, headers = client._datahub_impl._rest_client.post(
        f"/projects/{P}/topics/t/shards/0", data=body, compress_format=CompressFormat.LZ4)
    assert headers["Content-Encoding"] == "lz4" and int(headers["x-datahub-content-raw-size"]) > 4000
    assert json.loads(content)["Records"][0]["Data"] == base64.b64encode(b"y" * 4000).decode()


def test_tuple_round_trip_json_and_pb(server, client, pb_client):
    client.create_tuple_topic(P, "rows", 1, 1, SCHEMA, "")
    values = [
        ["text", 2 ** 62, 1.25, 1_700_000_000_000_000, True, Decimal("12.3400"), -5, 0.5],
        [None, None, None, None, None, None, None, None],
        ["", -1, -0.0, 0, False, Decimal("-1E+3"), 2 ** 31 - 1, 3.0],
    ]
    assert client.put_records(P, "rows", [row(v, "0", n=str(i)) for i, v in enumerate(values)]) \
        .failed_record_count == 0
    pb_client.put_records_by_shard(P, "rows", "0", [row(values[0], a="pb")])
    via_json = read_all(client, "rows", "0", SCHEMA)
    via_pb = read_all(pb_client, "rows", "0", SCHEMA)
    landed = server.records(P, "rows")
    assert [list(r.values) for r in via_json] == [x["values"] for x in landed] == values + [values[0]]
    # protobuf cannot tell a null from an empty STRING: pydatahub reads both back as ""
    assert [list(r.values) for r in via_pb] == [values[0], [""] + values[1][1:], values[2], values[0]]
    assert [r.attributes for r in via_json] == [{"n": "0"}, {"n": "1"}, {"n": "2"}, {"a": "pb"}]
    assert [r.attributes for r in via_pb] == [{"n": "0"}, {"n": "1"}, {"n": "2"}, {"a": "pb"}]
    assert [x["sequence"] for x in landed] == [0, 1, 2, 3]


def test_blob_written_by_pb_read_by_json(server, client, pb_client):
    client.create_blob_topic(P, "t", 1, 1, "")
    assert pb_client.put_records(P, "t", [blob(b"one", "0", k="1"), blob(b"two", "0")]).failed_record_count == 0
    got = read_all(client, "t", "0")
    assert [(r.blob_data, r.attributes) for r in got] == [(b"one", {"k": "1"}), (b"two", {})]
    got = read_all(pb_client, "t", "0")
    assert [(r.blob_data, r.attributes, r.sequence) for r in got] == [(b"one", {"k": "1"}, 0), (b"two", {}, 1)]


def test_routing_by_partition_key_and_hash_key(server, client):
    client.create_blob_topic(P, "t", 3, 1, "")
    shards = client.list_shard(P, "t").shards

    def owner(h):
        return next(s.shard_id for s in shards
                    if int(s.begin_hash_key, 16) <= h < int(s.end_hash_key, 16) or
                    (s.end_hash_key == "F" * 32 and h >= int(s.begin_hash_key, 16)))

    records, want = [], {}
    for i in range(30):
        r = blob(b"%d" % i)
        if i % 2:
            r.partition_key = f"key-{i}"
            h = int(hashlib.md5(r.partition_key.encode()).hexdigest(), 16)
        else:
            r.hash_key = hashlib.md5(b"%d" % i).hexdigest()
            h = int(r.hash_key, 16)
        records.append(r)
        want.setdefault(owner(h), []).append(b"%d" % i)
    assert client.put_records(P, "t", records).failed_record_count == 0
    for sid in ("0", "1", "2"):
        assert [x["data"] for x in server.records(P, "t", sid)] == want.get(sid, [])
    assert len(want) == 3


def test_put_records_per_record_errors(server, client):
    client.create_blob_topic(P, "t", 2, 1, "")
    records = [blob(b"a", "0"), blob(b"b", "7"), blob(b"c", "AAA"), blob(b"d"), blob(b"e", "1")]
    result = client.put_records(P, "t", records)
    assert result.failed_record_count == 3
    assert [(f.index, f.error_code) for f in result.failed_records] == [
        (1, "NoSuchShard"), (2, "InvalidShardId"), (3, "InvalidParameter")]
    assert [x["data"] for x in server.records(P, "t")] == [b"a", b"e"]


def test_request_size_limit(server):
    server.max_request_bytes = 10_000
    client = DataHub("id", "key", server.endpoint, compress_format=CompressFormat.NONE)
    client.create_blob_topic(P, "t", 1, 1, "")
    with pytest.raises(InvalidParameterException):
        client.put_records(P, "t", [blob(b"z" * 20_000, "0")])
    assert server.records(P, "t") == []


# --- cursors ------------------------------------------------------------------------------------

def test_cursors_of_each_type(server, client):
    client.create_blob_topic(P, "t", 2, 1, "")
    empty = client.get_cursor(P, "t", "0", CursorType.OLDEST)
    assert (empty.sequence, empty.record_time, empty.cursor) == (0, 0, "3" + "0" * 31)
    assert client.get_cursor(P, "t", "0", CursorType.LATEST).sequence == 0
    assert client.get_blob_records(P, "t", "0", empty.cursor, 10).record_count == 0
    with pytest.raises(SeekOutOfRangeException):
        client.get_cursor(P, "t", "0", CursorType.SEQUENCE, 1)

    t0 = int(time.time() * 1000)
    client.put_records(P, "t", [blob(b"%d" % i, "0") for i in range(5)])
    time.sleep(0.02)
    t1 = int(time.time() * 1000)
    client.put_records(P, "t", [blob(b"%d" % i, "0") for i in range(5, 10)])
    times = [x["system_time"] for x in server.records(P, "t", "0")]

    oldest = client.get_cursor(P, "t", "0", CursorType.OLDEST)
    assert (oldest.sequence, oldest.record_time) == (0, times[0])
    latest = client.get_cursor(P, "t", "0", CursorType.LATEST)
    assert (latest.sequence, latest.record_time) == (9, times[9])
    res = client.get_blob_records(P, "t", "0", latest.cursor, 10)
    assert [r.blob_data for r in res.records] == [b"9"]
    seq = client.get_cursor(P, "t", "0", CursorType.SEQUENCE, 7)
    assert seq.sequence == 7
    assert [r.sequence for r in client.get_blob_records(P, "t", "0", seq.cursor, 2).records] == [7, 8]
    by_time = client.get_cursor(P, "t", "0", CursorType.SYSTEM_TIME, t0 - 1000)
    assert by_time.sequence == 0
    later = client.get_cursor(P, "t", "0", CursorType.SYSTEM_TIME, t1)
    assert later.sequence == 5 and later.record_time == times[5] >= t1
    with pytest.raises(SeekOutOfRangeException):
        client.get_cursor(P, "t", "0", CursorType.SYSTEM_TIME, int(time.time() * 1000) + 60_000)
    with pytest.raises(SeekOutOfRangeException):
        client.get_cursor(P, "t", "0", CursorType.SEQUENCE, 11)
    with pytest.raises(ResourceNotFoundException) as e:
        client.get_cursor(P, "t", "9", CursorType.OLDEST)
    assert e.value.error_code == "NoSuchShard"


def test_get_records_pages_with_next_cursor(server, client):
    client.create_blob_topic(P, "t", 1, 1, "")
    client.put_records(P, "t", [blob(b"%d" % i, "0") for i in range(25)])
    cursor = client.get_cursor(P, "t", "0", CursorType.OLDEST).cursor
    pages = []
    while True:
        res = client.get_blob_records(P, "t", "0", cursor, 10)
        if not res.record_count:
            break
        assert res.start_seq == res.records[0].sequence
        pages.append([r.sequence for r in res.records])
        cursor = res.next_cursor
    assert pages == [list(range(10)), list(range(10, 20)), list(range(20, 25))]
    # at the end of an ACTIVE shard: no records and the same cursor; a new record shows up there
    again = client.get_blob_records(P, "t", "0", cursor, 10)
    assert again.record_count == 0 and again.next_cursor == cursor
    client.put_records(P, "t", [blob(b"late", "0")])
    assert [r.blob_data for r in client.get_blob_records(P, "t", "0", cursor, 10).records] == [b"late"]
    with pytest.raises(InvalidCursorException):
        client.get_blob_records(P, "t", "0", "not-a-cursor", 10)
    with pytest.raises(InvalidCursorException):  # a cursor of another shard
        client.get_blob_records(P, "t", "0", "3" + "0" * 6 + "1" + "0" * 24, 10)


# --- split, merge, closed shards -------------------------------------------------------------------

def test_split_and_merge(server, client, pb_client):
    client.create_blob_topic(P, "t", 2, 1, "")
    client.put_records(P, "t", [blob(b"before", "0")])
    new = client.split_shard(P, "t", "0").new_shards
    assert [s.shard_id for s in new] == ["2", "3"]
    by_id = {s.shard_id: s for s in client.list_shard(P, "t").shards}
    assert by_id["0"].state == ShardState.CLOSED and by_id["0"].closed_time > 0
    assert by_id["2"].state == by_id["3"].state == ShardState.ACTIVE
    assert by_id["2"].parent_shard_ids == by_id["3"].parent_shard_ids == ["0"]
    assert (by_id["2"].begin_hash_key, by_id["3"].end_hash_key) == (by_id["0"].begin_hash_key,
                                                                    by_id["0"].end_hash_key)
    assert by_id["2"].end_hash_key == by_id["3"].begin_hash_key
    assert client.get_topic(P, "t").shard_count == 3

    # writes to the CLOSED shard: PutRecords fails per record, PutRecordsByShard raises ShardSealed
    result = client.put_records(P, "t", [blob(b"late", "0"), blob(b"ok", "2")])
    assert [(f.index, f.error_code) for f in result.failed_records] == [(0, "InvalidShardOperation")]
    with pytest.raises(ShardSealedException) as e:
        pb_client.put_records_by_shard(P, "t", "0", [blob(b"late")])
    assert e.value.error_code == "InvalidShardOperation"
    # a CLOSED shard stays readable; reading past its end raises ShardSealed
    cursor = client.get_cursor(P, "t", "0", CursorType.OLDEST).cursor
    res = client.get_blob_records(P, "t", "0", cursor, 10)
    assert [r.blob_data for r in res.records] == [b"before"]
    with pytest.raises(ShardSealedException):
        client.get_blob_records(P, "t", "0", res.next_cursor, 10)
    with pytest.raises(ShardSealedException):
        client.split_shard(P, "t", "0")

    # merge 3 and 1 (adjacent); pydatahub 2.29's MergeShardResult cannot be constructed (TypeError in
    # its __init__) after the server answered, so the merge is checked through ListShard
    try:
        client.merge_shard(P, "t", "3", "1")
    except TypeError:
        pass
    by_id = {s.shard_id: s for s in client.list_shard(P, "t").shards}
    assert by_id["4"].state == ShardState.ACTIVE and by_id["4"].parent_shard_ids == ["3", "1"]
    assert by_id["1"].state == by_id["3"].state == ShardState.CLOSED
    assert (by_id["4"].begin_hash_key, by_id["4"].end_hash_key) == (by_id["3"].begin_hash_key, "F" * 32)
    with pytest.raises(DataHubError) as e:  # the direct helpers raise the stand-in's own error
        server.merge(P, "t", "2", "1")
    assert e.value.code == "InvalidShardOperation"
    assert [s["state"] for s in server.shards(P, "t")] == ["CLOSED", "CLOSED", "ACTIVE", "CLOSED", "ACTIVE"]
    # partition keys now route only to ACTIVE shards
    client.put_records(P, "t", [_pk(i) for i in range(20)])
    assert {x["shard"] for x in server.records(P, "t") if x["data"].startswith(b"pk")} <= {"2", "4"}


def _pk(i):
    r = blob(b"pk%d" % i)
    r.partition_key = str(i)
    return r


def test_server_side_split_helper(server):
    server.create_topic(P, "t", 1)
    assert server.split(P, "t", "0", "8" + "0" * 31) == ["1", "2"]
    shards = server.shards(P, "t")
    assert shards[1]["end_hash_key"] == "8" + "0" * 31 and shards[0]["state"] == "CLOSED"


# --- PutRecordsByShard -----------------------------------------------------------------------------

def test_put_records_by_shard_all_or_nothing(server, client, pb_client):
    client.create_tuple_topic(P, "rows", 2, 1, SCHEMA, "")
    good = [row(["a", i, 1.0, 1, True, Decimal(1), 1, 1.0], shard="1", i=str(i)) for i in range(3)]
    pb_client.put_records_by_shard(P, "rows", "0", good)  # the URL's shard wins over each record's
    assert [(x["shard"], x["values"][1], x["attributes"]) for x in server.records(P, "rows")] == [
        ("0", 0, {"i": "0"}), ("0", 1, {"i": "1"}), ("0", 2, {"i": "2"})]
    wide = RecordSchema.from_lists([f.name for f in SCHEMA.field_list] + ["extra"],
                                   [f.type for f in SCHEMA.field_list] + [FieldType.STRING])
    bad = row(["b", 9, 1.0, 1, True, Decimal(1), 1, 1.0, "extra"], schema=wide)
    with pytest.raises(InvalidParameterException) as e:
        pb_client.put_records_by_shard(P, "rows", "0", good + [bad])
    assert e.value.error_code == "MalformedRecord"
    assert len(server.records(P, "rows")) == 3  # nothing of the refused request landed
    with pytest.raises(ResourceNotFoundException):
        pb_client.put_records_by_shard(P, "rows", "5", good)
    # pydatahub's JSON client refuses by-shard writes before sending anything
    with pytest.raises(DatahubException, match="only support pb mode"):
        client.put_records_by_shard(P, "rows", "0", good)


def test_pydatahub_producer_writes_by_shard(server, tmp_path):
    """pydatahub's high-level producer (its close() alone takes about 9 s, inside pydatahub)."""
    from datahub.client.common.config import ProducerConfig
    from datahub.client.producer.datahub_producer import DatahubProducer
    server.create_topic(P, "t", 2)
    config = ProducerConfig("id", "key", server.endpoint)  # PB protocol is the producer's default
    config.logging_filename = str(tmp_path / "producer.log")
    producer = DatahubProducer(P, "t", config, shard_ids=["1"])
    try:
        producer.write([blob(b"p%d" % i, k=str(i)) for i in range(5)])
    finally:
        producer.close()
    assert [(x["shard"], x["data"], x["attributes"]) for x in server.records(P, "t")] == [
        ("1", b"p%d" % i, {"k": str(i)}) for i in range(5)]
    assert {r["op"] for r in server.requests} == {"GetTopic", "ListShard", "PutRecordsByShard"}


# --- tuple schema -----------------------------------------------------------------------------------

def test_tuple_schema_mismatch_refused(server, client):
    client.create_tuple_topic(P, "rows", 1, 1, SCHEMA, "")
    narrow = RecordSchema.from_lists(["s", "n"], [FieldType.STRING, FieldType.BIGINT])
    as_text = RecordSchema.from_lists([f.name for f in SCHEMA.field_list],
                                      [FieldType.STRING] * len(SCHEMA.field_list))
    ok = ["a", 1, 1.0, 1, True, Decimal(1), 1, 1.0]
    records = [
        row(ok, "0"),
        row(["a", 1], "0", schema=narrow),                                     # too few fields
        row(["a", "x", "1", "1", "true", "1", "1", "1"], "0", schema=as_text),  # BIGINT "x"
        row(["a", "1", "1", "1", "maybe", "1", "1", "1"], "0", schema=as_text),  # BOOLEAN "maybe"
        row(["a", "1", "1", "1", "true", "1", "3000000000", "1"], "0", schema=as_text),  # INTEGER range
        row(["a", "1", "1.5e3", "1", "TRUE", "1.5", "1", "1"], "0", schema=as_text),  # all valid text
        blob(b"blob into tuple", "0"),
    ]
    result = client.put_records(P, "rows", records)
    assert [(f.index, f.error_code) for f in result.failed_records] == [
        (1, "MalformedRecord"), (2, "MalformedRecord"), (3, "MalformedRecord"), (4, "MalformedRecord"),
        (6, "MalformedRecord")]
    assert [x["values"] for x in server.records(P, "rows")] == [
        ok, ["a", 1, 1500.0, 1, True, Decimal("1.5"), 1, 1.0]]
    client.create_blob_topic(P, "blobs", 1, 1, "")
    result = client.put_records(P, "blobs", [row(ok, "0")])
    assert [f.error_code for f in result.failed_records] == ["MalformedRecord"]


def test_append_field(server, client):
    client.create_tuple_topic(P, "rows", 1, 1, SCHEMA, "")
    old = ["a", 1, 1.0, 1, True, Decimal(1), 1, 1.0]
    client.put_records(P, "rows", [row(old, "0")])
    client.append_field(P, "rows", "added", FieldType.STRING)
    schema = client.get_topic(P, "rows").record_schema
    assert [f.name for f in schema.field_list][-1] == "added" and schema.field_list[-1].allow_null
    # the old schema no longer fits; the grown one does
    assert [f.error_code for f in client.put_records(P, "rows", [row(old, "0")]).failed_records] == \
        ["MalformedRecord"]
    assert client.put_records(P, "rows", [row(old + ["new"], "0", schema=schema)]).failed_record_count == 0
    got = read_all(client, "rows", "0", schema)
    assert [list(r.values) for r in got] == [old + [None], old + ["new"]]
    assert [x["values"] for x in server.records(P, "rows")] == [old + [None], old + ["new"]]
    with pytest.raises(InvalidParameterException):
        client.append_field(P, "rows", "added", FieldType.BIGINT)
    client.create_blob_topic(P, "blobs", 1, 1, "")
    with pytest.raises(InvalidOperationException):
        client.append_field(P, "blobs", "x", FieldType.STRING)


def test_pb_pages_keep_up_with_append_field(server, client, pb_client):
    """A protobuf page is made of each record's entry, encoded on its first read and kept: a Tuple
    topic that grows a field answers the next read with the wider rows."""
    client.create_tuple_topic(P, "rows", 1, 1, SCHEMA, "")
    old = ["a", 1, 1.0, 1, True, Decimal(1), 1, 1.0]
    client.put_records(P, "rows", [row(old, "0")])
    assert [list(r.values) for r in read_all(pb_client, "rows", "0", SCHEMA)] == [old]
    client.append_field(P, "rows", "added", FieldType.STRING)
    schema = client.get_topic(P, "rows").record_schema
    assert client.put_records(P, "rows", [row(old + ["new"], "0", schema=schema)]).failed_record_count == 0
    # (protobuf reads a null STRING back as "")
    assert [list(r.values) for r in read_all(pb_client, "rows", "0", schema)] == [old + [""], old + ["new"]]


@pytest.mark.parametrize("kind", ["BLOB", "TUPLE"])
def test_a_pb_page_is_the_whole_answer_encoded_at_once(server, kind):
    """The entries encoded one by one and joined after the page's head are byte for byte what
    encoding the whole GetRecordsResponse gives (what the stand-in did before it kept them)."""
    from support.datahub_standin import _encode, _pb
    if kind == "BLOB":
        server.create_topic(P, "t", 1)
    else:
        server.create_topic(P, "t", 1, "TUPLE", {"fields": [{"name": "a", "type": "string"},
                                                          {"name": "b", "type": "bigint"}]})
    t = server._topic(P, "t")
    shard = t.shards["0"]
    for i in range(60):
        server._append(shard, b"x" * (i * 7) if kind == "BLOB" else None,
                       None if kind == "BLOB" else ["v" * i, None if i % 3 else str(i)],
                       {"k": str(i), "dts.pos": "\u00e9%d" % i} if i % 5 else {})
    records = shard.records[10:50]
    entries = []
    for r in records:
        data = [{"value": r.data}] if kind == "BLOB" else \
            [{} if v is None else {"value": v.encode()} for v in server._tuple_out(t, r)]
        entries.append({"sequence": r.sequence, "system_time": r.system_time,
                        "cursor": server._cursor("0", r.sequence), "next_cursor": server._cursor("0", r.sequence + 1),
                        "attributes": {"attributes": [{"key": k, "value": v} for k, v in r.attributes.items()]},
                        "data": {"data": data}})
    head = {"next_cursor": server._cursor("0", 50), "record_count": len(records), "start_sequence": 10}
    whole = _encode(_pb().GetRecordsResponse, {**head, "records": entries})
    for _ in range(2):  # encoded on the first read, kept for the second
        assert b"".join([_encode(_pb().GetRecordsResponse, head)] +
                        [server._pb_entry(t, shard, r) for r in records]) == whole


# --- faults -----------------------------------------------------------------------------------------

def test_partial_failure_reorders_naive_retries(server, client):
    client.create_blob_topic(P, "t", 1, 1, "")
    server.faults.partial_failure(indexes=[0], code="LimitExceeded")
    records = [blob(b"%d" % i, "0") for i in range(4)]
    result = client.put_records(P, "t", records)
    assert [(f.index, f.error_code) for f in result.failed_records] == [(0, "LimitExceeded")]
    assert result.failed_record_count == 1
    assert [x["data"] for x in server.records(P, "t")] == [b"1", b"2", b"3"]  # later records landed
    client.put_records(P, "t", [records[0]])  # a naive retry of the failed one lands after them
    assert [x["data"] for x in server.records(P, "t")] == [b"1", b"2", b"3", b"0"]
    assert server.faults.count("partial", "PutRecords") == 1
    server.faults.partial_failure(indexes=lambda n: range(1, n, 2), code="InternalServerError", times=2)
    for _ in range(2):
        failed = client.put_records(P, "t", [blob(b"x", "0")] * 4).failed_records
        assert [(f.index, f.error_code) for f in failed] == [(1, "InternalServerError"), (3, "InternalServerError")]
    assert client.put_records(P, "t", [blob(b"x", "0")] * 4).failed_record_count == 0


def test_partial_failure_in_pb_protocol(server, pb_client):
    server.create_topic(P, "t", 1)
    server.faults.partial_failure(indexes=[0, 2])
    result = pb_client.put_records(P, "t", [blob(b"%d" % i, "0") for i in range(3)])
    assert [(f.index, f.error_code) for f in result.failed_records] == [(0, "LimitExceeded"), (2, "LimitExceeded")]
    assert [x["data"] for x in server.records(P, "t")] == [b"1"]


def test_fail_next_5xx_and_error_codes(server, client):
    client.create_blob_topic(P, "t", 1, 1, "")
    server.faults.fail_next("PutRecords", times=2)
    for _ in range(2):
        with pytest.raises(InternalServerException) as e:
            client.put_records(P, "t", [blob(b"a", "0")])
        assert e.value.status_code == 500 and e.value.error_code == "InternalServerError"
    client.put_records(P, "t", [blob(b"a", "0")])
    assert len(server.records(P, "t")) == 1
    server.faults.fail_next("ListShard", 503, "ServiceUnavailable", "busy")
    with pytest.raises(DatahubException) as e:
        client.list_shard(P, "t")
    assert e.value.status_code == 503 and e.value.error_code == "ServiceUnavailable"
    server.faults.fail_next("*", 502, raw_body=b"<html>502 Bad Gateway</html>")
    with pytest.raises(DatahubException, match="Decode json message error"):
        client.get_topic(P, "t")
    assert client.get_topic(P, "t").shard_count == 1
    assert server.faults.pending == 0


def test_unserved_operations_are_refused(server, client):
    client.create_blob_topic(P, "t", 1, 1, "")
    with pytest.raises(InvalidOperationException):
        client.extend_shard(P, "t", 4)
    with pytest.raises(InvalidOperationException):
        client.get_metering_info(P, "t", "0")
    batch = DataHub("id", "key", server.endpoint, protocol_type=DatahubProtocolType.BATCH,
                    enable_schema_register=False)
    with pytest.raises(InvalidParameterException, match="BATCH"):
        batch.put_records_by_shard(P, "t", "0", [blob(b"x")])
    assert len(client.list_shard(P, "t").shards) == 1


def test_a_whole_request_failure_keeps_the_partial_rule_for_the_next_request(server, client):
    server.create_topic(P, "t", 1)
    server.faults.partial_failure(indexes=[1])
    server.faults.fail_next("PutRecords", 500)
    with pytest.raises(InternalServerException):
        client.put_records(P, "t", [blob(b"a", "0"), blob(b"b", "0")])
    failed = client.put_records(P, "t", [blob(b"a", "0"), blob(b"b", "0")]).failed_records
    assert [f.index for f in failed] == [1] and server.faults.pending == 0
    assert [x["data"] for x in server.records(P, "t")] == [b"a"]


def test_fail_after_apply_lands_the_write(server, client):
    client.create_blob_topic(P, "t", 1, 1, "")
    server.faults.fail_next("PutRecords", 500, "InternalServerError", after_apply=True)
    with pytest.raises(InternalServerException):
        client.put_records(P, "t", [blob(b"a", "0")])
    assert [x["data"] for x in server.records(P, "t")] == [b"a"]  # the write took effect anyway


def test_throttle(server, client):
    client.create_blob_topic(P, "t", 1, 1, "")
    server.faults.throttle(0)
    with pytest.raises(LimitExceededException) as e:
        client.put_records(P, "t", [blob(b"a", "0")])
    assert e.value.status_code == 429 and e.value.error_code == "LimitExceeded"
    assert client.list_shard(P, "t").shards  # reads are not throttled by default
    server.faults.throttle(5, burst=3)
    outcomes = []
    for _ in range(6):
        try:
            client.put_records(P, "t", [blob(b"a", "0")])
            outcomes.append("ok")
        except LimitExceededException:
            outcomes.append("throttled")
    assert outcomes[:3] == ["ok"] * 3 and "throttled" in outcomes[3:]
    time.sleep(0.5)  # the bucket refills at 5/s
    client.put_records(P, "t", [blob(b"a", "0")])
    server.faults.throttle(None)
    for _ in range(10):
        client.put_records(P, "t", [blob(b"a", "0")])
    assert server.faults.count("throttle") == outcomes.count("throttled") + 1


def test_delay_and_client_timeout(server):
    server.create_topic(P, "t", 1)
    client = DataHub("id", "key", server.endpoint)
    server.faults.delay("ListShard", 0.3, times=1)
    start = time.monotonic()
    client.list_shard(P, "t")
    assert time.monotonic() - start >= 0.3
    start = time.monotonic()
    client.list_shard(P, "t")
    assert time.monotonic() - start < 0.3
    impatient = DataHub("id", "key", server.endpoint, read_timeout=0.2, retry_times=0)
    server.faults.delay("PutRecords", 0.6, times=1, after_apply=True)
    with pytest.raises(requests.exceptions.ReadTimeout):
        impatient.put_records(P, "t", [blob(b"slow", "0")])
    time.sleep(0.6)
    assert [x["data"] for x in server.records(P, "t")] == [b"slow"]  # landed although the client gave up


def test_reset_connection(server, client):
    client.create_blob_topic(P, "t", 1, 1, "")
    server.faults.reset_connection("PutRecords")
    with pytest.raises(requests.exceptions.ConnectionError):
        client.put_records(P, "t", [blob(b"lost", "0")])
    assert server.records(P, "t") == []
    server.faults.reset_connection("PutRecords", after_apply=True)
    with pytest.raises(requests.exceptions.ConnectionError):
        client.put_records(P, "t", [blob(b"acked-lost", "0")])
    assert [x["data"] for x in server.records(P, "t")] == [b"acked-lost"]
    client.put_records(P, "t", [blob(b"fine", "0")])  # the client reconnects
    assert len(server.records(P, "t")) == 2
    assert server.faults.count("reset") == 2
    # pydatahub's HTTPAdapter(max_retries=3) retries GETs on its own, never POSTs
    server.faults.reset_connection("ListShard", times=3)
    assert len(client.list_shard(P, "t").shards) == 1
    server.faults.reset_connection("ListShard", times=4)
    with pytest.raises(requests.exceptions.ConnectionError):
        client.list_shard(P, "t")
    assert server.faults.count("reset", "ListShard") == 7


def test_faults_limited_to_one_shard(server, pb_client):
    server.create_topic(P, "t", 2)
    server.faults.fail_next("PutRecordsByShard", 500, shard="1", times=None)
    pb_client.put_records_by_shard(P, "t", "0", [blob(b"a")])
    with pytest.raises(InternalServerException):
        pb_client.put_records_by_shard(P, "t", "1", [blob(b"b")])
    server.faults.clear()
    pb_client.put_records_by_shard(P, "t", "1", [blob(b"b")])
    assert [(x["shard"], x["data"]) for x in server.records(P, "t")] == [("0", b"a"), ("1", b"b")]


def _chaos_run(seed):
    with StandInDataHub() as s:
        s.create_topic(P, "t", 2)
        c = DataHub("id", "key", s.endpoint, retry_times=0)
        s.faults.chaos(seed, p_5xx=0.15, p_throttle=0.15, p_partial=0.2, p_delay=0.2, p_reset=0.1,
                       p_ack_lost=0.1, max_delay=0.01)
        outcomes = []
        for i in range(40):
            try:
                r = c.put_records(P, "t", [blob(b"%d-%d" % (i, j), str(j % 2)) for j in range(4)])
                outcomes.append(tuple(f.index for f in r.failed_records))
            except (DatahubException, requests.exceptions.RequestException) as e:
                outcomes.append(type(e).__name__)
        return outcomes, list(s.faults.injected), [(x["shard"], x["data"]) for x in s.records(P, "t")]


def test_chaos_is_deterministic_per_seed():
    a, b, c = _chaos_run(7), _chaos_run(7), _chaos_run(8)
    assert a == b
    assert a[0] != c[0]
    kinds = {k for _, k in a[1]}
    assert {"chaos-5xx", "chaos-throttle", "chaos-partial", "chaos-delay"} <= kinds
    assert any(o == () for o in a[0]) and any(isinstance(o, tuple) and o for o in a[0])


def test_chaos_with_a_retrying_writer_loses_nothing(server, client):
    """The workload a sink faces: retry failed requests and failed records until all landed."""
    server.create_topic(P, "c", 1)
    server.faults.chaos(3, p_5xx=0.1, p_throttle=0.1, p_partial=0.3, p_reset=0.1)
    todo = [blob(b"%d" % i, "0") for i in range(60)]
    rounds = 0
    while todo and rounds < 200:
        rounds += 1
        try:
            failed = client.put_records(P, "c", todo[:10]).failed_records
            todo = [todo[f.index] for f in failed] + todo[10:]
        except (DatahubException, requests.exceptions.RequestException):
            pass
    assert not todo
    assert sorted(x["data"] for x in server.records(P, "c")) == sorted(b"%d" % i for i in range(60))
    server.faults.chaos(None)
    assert client.put_records(P, "c", [blob(b"calm", "0")]).failed_record_count == 0


def test_faults_are_thread_safe(server):
    server.create_topic(P, "t", 4)
    server.faults.fail_next("PutRecords", times=20)
    errors = []

    def worker(n):
        c = DataHub("id", "key", server.endpoint)
        for i in range(10):
            try:
                c.put_records(P, "t", [blob(b"%d-%d" % (n, i), str(n))])
            except InternalServerException:
                errors.append(n)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 20 and len(server.records(P, "t")) == 20
    for n in range(4):  # per shard, the sequence is dense and in each writer's order
        got = server.records(P, "t", str(n))
        assert [x["sequence"] for x in got] == list(range(len(got)))
        assert got == sorted(got, key=lambda x: int(x["data"].split(b"-")[1]))


# --- authentication, lifecycle, process mode ----------------------------------------------------------

def test_authorization_header_required(server):
    server.create_topic(P, "t", 1)
    req = urllib.request.Request(f"{server.endpoint}/projects/{P}/topics/t/shards")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 401 and json.loads(e.value.read())["ErrorCode"] == "Unauthorized"
    assert DataHub("any-id", "any-key", server.endpoint).list_shard(P, "t").shards


def test_signature_checked_when_credentials_given():
    with StandInDataHub(credentials={"good-id": "good-key"}) as s:
        s.create_topic(P, "t", 1)
        assert DataHub("good-id", "good-key", s.endpoint).list_shard(P, "t").shards
        DataHub("good-id", "good-key", s.endpoint).put_records(P, "t", [blob(b"signed", "0")])
        with pytest.raises(AuthorizationFailedException):
            DataHub("good-id", "bad-key", s.endpoint).list_shard(P, "t")
        with pytest.raises(AuthorizationFailedException):
            DataHub("other-id", "good-key", s.endpoint).list_shard(P, "t")


def test_stop_keeps_state_and_start_serves_it_again(server, client):
    client.create_blob_topic(P, "t", 1, 1, "")
    client.put_records(P, "t", [blob(b"kept", "0")])
    port = server.port
    server.stop()
    with pytest.raises(requests.exceptions.ConnectionError):
        DataHub("id", "key", f"http://127.0.0.1:{port}", retry_times=0).list_shard(P, "t")
    server.start()
    assert server.port == port
    assert [r.blob_data for r in read_all(client, "t", "0")] == [b"kept"]


def test_request_log(server, client):
    client.create_blob_topic(P, "t", 2, 1, "")
    server.faults.fail_next("PutRecords")
    with pytest.raises(InternalServerException):
        client.put_records(P, "t", [blob(b"a", "0"), blob(b"b", "1")])
    client.put_records(P, "t", [blob(b"a", "0"), blob(b"b", "1")])
    puts = [r for r in server.requests if r["op"] == "PutRecords"]
    assert [(r["status"], r["records"], r["faults"]) for r in puts] == [(500, 2, ["error"]), (200, 2, [])]
    server.reset()
    assert server.requests == [] and server.faults.injected == []
    with pytest.raises(ResourceNotFoundException):
        client.get_topic(P, "t")


def test_process_mode_with_state_file(tmp_path):
    state = tmp_path / "state.json"
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.datahub_standin", "--state-file", str(state),
                             "--topic", f"{P}/t:2"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        endpoint = proc.stdout.readline().strip()
        c = DataHub("id", "key", endpoint)
        assert len(c.list_shard(P, "t").shards) == 2
        c.put_records(P, "t", [blob(b"persisted", "1", k="v")])
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    with StandInDataHub() as s:
        s.load_state(json.loads(state.read_text()))
        assert [(x["shard"], x["data"], x["attributes"]) for x in s.records(P, "t")] == [("1", b"persisted", {"k": "v"})]
