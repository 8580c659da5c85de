"""DataHub Blob messages -> DTS Entries (docs/mapping.md).

* `decode_blob` reports bad JSON and bad envelope shapes as BlobFormatError naming the line.
* Messages in every documented DataWorks shape convert to DTS and back to equal documents; their
  DTS form is checked field by field, and read by an independent protobuf class compiled from the
  wire format's own transcription (tests/support/wire_spec.py) into its own descriptor pool (`spec_classes`).
* Update halves whose partner never comes are reported, never dropped.
* The recorded golden Blob files (tests/golden/*.blob.jsonl, written from the samples) decode back
  to the sample Entries byte for byte: encode and decode driven from the same recorded file.
"""
from __future__ import annotations

import base64
import copy
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st

import bridge
from bridge import BlobFormatError, BridgeError, ConversionError, Options, pb
from bridge.stream import ErrorPolicy, blob_lines_to_entries, dts_json_lines_to_entries
from support.blob_strategies import foreign_messages
from support.wire_spec import compile_spec

GOLDEN = Path(__file__).resolve().parent / "golden"
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
STRICT = Options(strict=True)
RESERVED = "datahub:"


def through_json(messages) -> list[dict]:
    return [bridge.decode_blob(bridge.encode_blob(m)) for m in messages]


def to_blob(entries, options=Options()) -> list[dict]:
    encoder = bridge.BlobEncoder(options)
    return through_json([m for e in entries for m in encoder.convert(e)])


def reserved_keys(entry: pb.Entry) -> list[str]:
    """Every `datahub:` property key anywhere in an Entry."""
    lists = [entry.header.properties, entry.event.properties]
    lists += [c.properties for c in entry.event.dmlEvent.columns]
    lists += [r.properties for r in entry.event.dmlEvent.rows]
    return [p.key for props in lists for p in props if p.key.startswith(RESERVED)]


def facts(message) -> dict:
    """The reserved `datahub:` properties of a Header, RowChange or Column, without the prefix."""
    return {p.key[len(RESERVED):]: p.value for p in message.properties if p.key.startswith(RESERVED)}


# ---- decode_blob: bad JSON and bad shapes --------------------------------------------------------

BAD_DOCUMENTS = [
    (b'{"schema": {}, "payload": ', "invalid JSON"),
    (b"\xff\xfe", "invalid JSON"),
    (b"", "invalid JSON"),
    (b"[]", "JSON object"),
    (b'"MHEARTBEAT"', "JSON object"),
    (b"{}", "payload"),
    (b'{"payload": []}', "payload"),
    (b'{"payload": {"sequenceId": "1", "timestamp": {"eventTime": 1605339932000}}}', "op"),
    (b'{"payload": {"op": "HEARTBEAT", "sequenceId": "1", "timestamp": {"eventTime": 1605339932000}}}', "op"),
    (b'{"payload": {"op": "insert", "sequenceId": "1", "timestamp": {"eventTime": 1605339932000}}}', "op"),
    (b'{"payload": {"op": "MHEARTBEAT", "sequenceId": 1, "timestamp": {"eventTime": 1605339932000}}}', "sequenceId"),
    (b'{"payload": {"op": "MHEARTBEAT", "sequenceId": "1a", "timestamp": {"eventTime": 1605339932000}}}',
     "sequenceId"),
    (b'{"payload": {"op": "MHEARTBEAT", "sequenceId": "", "timestamp": {"eventTime": 1605339932000}}}', "sequenceId"),
    ('{"payload": {"op": "MHEARTBEAT", "sequenceId": "١٢", "timestamp": {"eventTime": 1605339932000}}}'.encode(),
     "sequenceId"),
    (b'{"payload": {"op": "MHEARTBEAT", "sequenceId": "1"}}', "eventTime"),
    (b'{"payload": {"op": "MHEARTBEAT", "sequenceId": "1", "timestamp": {}}}', "eventTime"),
    (b'{"payload": {"op": "MHEARTBEAT", "sequenceId": "1", "timestamp": {"eventTime": "1605339932000"}}}',
     "eventTime"),
    (b'{"payload": {"op": "MHEARTBEAT", "sequenceId": "1", "timestamp": {"eventTime": true}}}', "eventTime"),
    (b'{"payload": {"op": "MHEARTBEAT", "sequenceId": "1", "timestamp": {"eventTime": 1.5e12}}}', "eventTime"),
    (b'{"schema": [], "payload": {"op": "MHEARTBEAT", "sequenceId": "1", "timestamp": {"eventTime": 1605339932000}}}',
     "schema"),
]


@pytest.mark.parametrize("raw, words", BAD_DOCUMENTS)
def test_decode_blob_reports_bad_documents_with_their_line(raw, words):
    with pytest.raises(BlobFormatError) as info:
        bridge.decode_blob(raw, line=7, source="in.jsonl")
    err = info.value
    assert words in err.reason
    assert err.where["line"] == 7 and err.where["source"] == "in.jsonl"
    assert "line 7" in str(err)


def test_bad_lines_go_to_the_error_policy_with_line_numbers():
    good = bridge.encode_blob(HEARTBEAT)
    policy = ErrorPolicy("skip")
    out = list(blob_lines_to_entries([good, b"{oops", b"", b"[]", good], policy))
    assert len(out) == 2
    assert [r["line"] for r in policy.rejects] == [2, 4]
    assert policy.tally.input == 4 and policy.tally.rejected == 2 and policy.tally.balanced()
    with pytest.raises(BlobFormatError, match="line 2"):
        list(blob_lines_to_entries([good, b"{oops"], ErrorPolicy("fail")))


# ---- DataWorks-shaped messages -------------------------------------------------------------------

SOURCE = {"dbType": "MySQL", "dbVersion": "5.7.34-log", "dbName": "shop", "schemaName": "shop", "tableName": "orders"}
COLUMNS = [{"name": "id", "type": "LONG"}, {"name": "amount", "type": "DOUBLE"}, {"name": "paid", "type": "BOOLEAN"},
           {"name": "note", "type": "STRING"}, {"name": "raw", "type": "BYTES"}, {"name": "at", "type": "DATE"}]
SCHEMA = {"dataColumn": COLUMNS, "primaryKey": ["id"], "source": SOURCE}
STAMP = {"eventTime": 1605339932000, "systemTime": 1605339932736, "checkpointTime": 1605339932000}
BEFORE = {"dataColumn": {"id": 1, "amount": 9.5, "paid": False, "note": "旧 note", "raw": "AP8=", "at": 1605339932123}}
AFTER = {"dataColumn": {"id": 1, "amount": 10.25, "paid": True, "note": None, "raw": "", "at": 1605339933000}}
# An opaque Java-serialised statement (starts with the Java serialisation magic AC ED 00 05).
DDL_META = base64.b64encode(b"\xac\xed\x00\x05sr\x00\x1ecom.alibaba.ddl.AlterStatement\x00\x01\x02").decode()


def message(op, payload_extra, schema=SCHEMA, seq="1605339516000000004", stamp=STAMP, version="0.0.1"):
    msg = {"schema": schema, "payload": {**payload_extra, "op": op, "sequenceId": seq, "timestamp": stamp}}
    if version is not None:
        msg["version"] = version
    return msg


HEARTBEAT = {"schema": {}, "payload": {"op": "MHEARTBEAT", "sequenceId": "1605339516000000009",
                                       "timestamp": {"eventTime": 1605339932000, "systemTime": 1605339932736}}}

SHAPES = {
    "insert": [message("INSERT", {"before": None, "after": AFTER})],
    "insert without before, dbVersion or systemTime": [message(
        "INSERT", {"after": AFTER}, schema={**SCHEMA, "source": {k: v for k, v in SOURCE.items() if k != "dbVersion"}},
        stamp={"eventTime": 1605339932000, "checkpointTime": 1605339932000})],
    "insert with a millisecond eventTime": [message(
        "INSERT", {"after": AFTER}, stamp={"eventTime": 1605339932123, "systemTime": 1605339932736,
                                           "checkpointTime": 1605339932123})],
    "insert with only eventTime": [message("INSERT", {"after": AFTER}, stamp={"eventTime": 1605339932999})],
    "update pair": [message("UPDATE_BEFOR", {"before": BEFORE, "after": None}),
                    message("UPDATE_AFTER", {"before": None, "after": AFTER})],
    "update pair with different systemTimes": [
        message("UPDATE_BEFOR", {"before": BEFORE}, stamp={**STAMP, "systemTime": 1605339932735}),
        message("UPDATE_AFTER", {"after": AFTER})],
    "one UPDATE with both images": [message("UPDATE", {"before": BEFORE, "after": AFTER})],
    "delete": [message("DELETE", {"before": BEFORE, "after": None, "ddl": None})],
    "minimal images": [message("UPDATE_BEFOR", {"before": {"dataColumn": {"id": 1}}}),
                       message("UPDATE_AFTER", {"after": {"dataColumn": {"paid": True}}})],
    "heartbeat": [HEARTBEAT],
    "begin": [message("TRANSACTION_BEGIN", {}, schema={})],
    "commit": [message("TRANSACTION_END", {}, schema={}, version=None)],
    "ddl with ddlMeta": [message("ALTER", {"ddl": {"text": "ALTER TABLE `orders` ADD COLUMN note2 varchar(8)",
                                                    "ddlMeta": DDL_META}}, schema={"source": SOURCE})],
    "ddl without ddlMeta": [message("CREATE", {"ddl": {"text": "CREATE TABLE t (id bigint primary key)"}},
                                    schema={"source": {**SOURCE, "tableName": "t"}})],
    "ddl whose op the text does not say": [message("QUERY", {"ddl": {"text": "ALTER TABLE t ADD c INT"}},
                                                   schema={"source": SOURCE})],
    "no primaryKey, no schemaName": [message(
        "INSERT", {"after": {"dataColumn": {"id": 2}}},
        schema={"dataColumn": [{"name": "id", "type": "LONG"}],
                "source": {"dbType": "MySQL", "dbName": "logs", "tableName": "access"}})],
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_dataworks_shapes_round_trip(name):
    """Law 2 (tests/test_laws.py) with the default (lossless) options: Blob -> DTS -> Blob is the same document."""
    messages = SHAPES[name]
    for msg in messages:
        bridge.validate_blob(msg)
    entries = list(bridge.blob_to_entries(through_json(messages)))
    entries = [pb.Entry.FromString(e.SerializeToString()) for e in entries]
    assert to_blob(entries) == messages


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_dataworks_shapes_round_trip_through_a_strict_encoder(name):
    entries = list(bridge.blob_to_entries(through_json(SHAPES[name])))
    assert to_blob(entries, STRICT) == SHAPES[name]


def test_insert_dts_form():
    [entry] = bridge.blob_to_entries(SHAPES["insert"])
    h = entry.header
    assert (h.version, h.messageType, h.sourceType, h.schemaName, h.tableName) == (1, pb.DML, pb.MYSQL, "shop", "orders")
    assert h.timestamp == 1605339932 and h.seqId == 1605339516000
    dml = entry.event.dmlEvent
    # what DataHub says and DTS cannot travels in reserved properties (of the row change)
    assert {**facts(h), **facts(dml.rows[0])} == {"systemTime": "1605339932736", "sequenceId": "1605339516000000004",
                                                  "dbVersion": "5.7.34-log", "nullImage": "before"}
    assert dml.dmlEventType == pb.INSERT
    assert [(c.name, c.originalType, c.isKey) for c in dml.columns] == [
        ("id", "bigint(20)", True), ("amount", "double", False), ("paid", "tinyint(1)", False),
        ("note", "longtext", False), ("raw", "longblob", False), ("at", "datetime(3)", False)]
    assert facts(dml.columns[2]) == {"type": "BOOLEAN"}
    [row] = dml.rows
    assert list(row.oldColumns) == []
    assert list(row.newColumns) == [
        pb.Data(dataType=pb.INT64, sv="1"), pb.Data(dataType=pb.FLOAT64, sv="10.25"),
        pb.Data(dataType=pb.INT8, sv="1"), pb.Data(dataType=pb.NIL), pb.Data(dataType=pb.BYTES, bv=b""),
        pb.Data(dataType=pb.STRING, bv=b"2020-11-14 07:45:33.000")]


def test_foreign_types_map_to_documented_dts_types():
    before = BEFORE["dataColumn"]
    [entry] = bridge.blob_to_entries(SHAPES["update pair"])
    [row] = entry.event.dmlEvent.rows
    assert entry.event.dmlEvent.dmlEventType == pb.UPDATE
    assert list(row.oldColumns) == [
        pb.Data(dataType=pb.INT64, sv=str(before["id"])), pb.Data(dataType=pb.FLOAT64, sv="9.5"),
        pb.Data(dataType=pb.INT8, sv="0"), pb.Data(dataType=pb.STRING, charset="utf8mb4", bv="旧 note".encode()),
        pb.Data(dataType=pb.BYTES, bv=b"\x00\xff"), pb.Data(dataType=pb.STRING, bv=b"2020-11-14 07:45:32.123")]
    # DATE text is written in the configured zone
    [entry] = bridge.blob_to_entries(SHAPES["update pair"], Options(timezone="Asia/Shanghai"))
    assert entry.event.dmlEvent.rows[0].oldColumns[5].bv == b"2020-11-14 15:45:32.123"
    assert to_blob([entry], Options(timezone="Asia/Shanghai", strict=True)) == SHAPES["update pair"]


def test_minimal_images_give_na():
    [entry] = bridge.blob_to_entries(SHAPES["minimal images"])
    [row] = entry.event.dmlEvent.rows
    assert [d.dataType for d in row.oldColumns] == [pb.INT64, pb.NA, pb.NA, pb.NA, pb.NA, pb.NA]
    assert [d.dataType for d in row.newColumns] == [pb.NA, pb.NA, pb.INT8, pb.NA, pb.NA, pb.NA]


def test_one_update_message_with_both_images_gives_one_row_change():
    [entry] = bridge.blob_to_entries(SHAPES["one UPDATE with both images"])
    [row] = entry.event.dmlEvent.rows
    assert entry.event.dmlEvent.dmlEventType == pb.UPDATE and len(row.oldColumns) == len(row.newColumns) == 6
    assert facts(row).get("op") == "UPDATE" or facts(entry.header).get("op") == "UPDATE"


def test_heartbeat_dts_form():
    [entry] = bridge.blob_to_entries([HEARTBEAT])
    assert entry.header.messageType == pb.HEARTBEAT and entry.event.HasField("heartbeatEvent")
    assert (entry.header.timestamp, entry.header.seqId) == (1605339932, 1605339516000)
    assert facts(entry.header) == {"systemTime": "1605339932736", "checkpointTime": "none",
                                   "sequenceId": "1605339516000000009", "version": "none"}


def test_ddl_meta_passes_through_untouched():
    [entry] = bridge.blob_to_entries(SHAPES["ddl with ddlMeta"])
    assert entry.header.messageType == pb.DDL
    assert entry.event.ddlEvent.sql == "ALTER TABLE `orders` ADD COLUMN note2 varchar(8)"
    assert facts(entry.header)["ddlMeta"] == DDL_META
    [msg] = to_blob([entry], STRICT)
    assert msg["payload"]["ddl"] == {"text": "ALTER TABLE `orders` ADD COLUMN note2 varchar(8)", "ddlMeta": DDL_META}
    [entry] = bridge.blob_to_entries(SHAPES["ddl whose op the text does not say"])
    assert facts(entry.header)["op"] == "QUERY"


@pytest.mark.parametrize("op, message_type", [("GTID", pb.CHECKPOINT), ("XACOMMIT", pb.COMMIT),
                                               ("XAROLLBACK", pb.ROLLBACK)])
def test_foreign_control_ops_map_to_their_nearest_entry_and_come_back(op, message_type):
    msg = message(op, {}, schema={})
    [entry] = bridge.blob_to_entries([msg])
    assert entry.header.messageType == message_type
    assert to_blob([entry], Options()) == [msg]


def test_a_heartbeat_without_sequence_id_as_the_spec_shows_it_round_trips():
    msg = {"schema": {}, "payload": {"op": "MHEARTBEAT", "timestamp": {"eventTime": 1605339932000}}}
    bridge.validate_blob(msg)
    [entry] = bridge.blob_to_entries([msg])
    assert entry.header.messageType == pb.HEARTBEAT and facts(entry.header)["sequenceId"] == "none"
    assert to_blob([entry], STRICT) == [msg]
    without = {"schema": {}, "payload": {"op": "INSERT", "timestamp": {"eventTime": 1605339932000}}}
    with pytest.raises(BlobFormatError):
        bridge.validate_blob(without)


def test_strict_decoding_writes_no_reserved_properties():
    """`strict`: "no reserved properties" (bridge/options.py) on the DTS side either."""
    for name, messages in SHAPES.items():
        for entry in bridge.blob_to_entries(messages, STRICT):
            assert not reserved_keys(entry), name


def test_an_event_time_the_schema_allows_survives():
    """eventTime is any 13-digit number (blob.schema.json); one past 2106 does not fit a uint32
    header, so it must travel as a fact or the schema must not call it valid."""
    msg = {**HEARTBEAT, "payload": {**HEARTBEAT["payload"], "timestamp": {"eventTime": 9999999999999}}}
    try:
        bridge.validate_blob(msg)
    except BlobFormatError:
        return
    assert to_blob(bridge.blob_to_entries([msg])) == [msg]


def test_bytes_values_that_validate_survive():
    """'QR==' is base64 the validator accepts (non-zero pad bits): it must come back as written,
    or validation must reject it."""
    msg = message("INSERT", {"after": {"dataColumn": {"id": 1, "raw": "QR=="}}})
    try:
        bridge.validate_blob(msg)
    except BlobFormatError:
        return
    assert to_blob(bridge.blob_to_entries([msg]), STRICT) == [msg]


@pytest.mark.parametrize("first, second", [
    (1605339932000, 1605339933000),   # halves a second apart
    (1605339932000, 1605339932500),   # one in milliseconds
])
def test_update_halves_with_different_event_times(first, second):
    pair = [message("UPDATE_BEFOR", {"before": BEFORE}, stamp={"eventTime": first, "checkpointTime": first}),
            message("UPDATE_AFTER", {"after": AFTER}, stamp={"eventTime": second, "checkpointTime": second})]
    assert to_blob(bridge.blob_to_entries(pair), STRICT) == pair


@pytest.mark.parametrize("bad, words", [
    ({"schema": {"source": SOURCE}}, "dataColumn"),
    ({"schema": {**SCHEMA, "dataColumn": [{"name": "id", "type": "INT"}]}}, "Blob column type"),
    ({"schema": {**SCHEMA, "dataColumn": [{"type": "LONG"}]}}, "name"),
    ({"schema": {**SCHEMA, "primaryKey": "id"}}, "primaryKey"),
    ({"schema": {**SCHEMA, "primaryKey": False}}, "primaryKey"),  # falsy, still not a list
    ({"schema": {**SCHEMA, "primaryKey": 0}}, "primaryKey"),
    ({"schema": {**SCHEMA, "source": "shop"}}, "source"),
    ({"payload": {"after": [1]}}, "dataColumn"),
    ({"payload": {"after": {"dataColumn": {"nope": 1}}}}, "not in schema"),
    ({"payload": {"after": {"dataColumn": {"id": "1"}}}}, "LONG"),
    ({"payload": {"after": {"dataColumn": {"id": True}}}}, "LONG"),
    ({"payload": {"after": {"dataColumn": {"amount": "9.5"}}}}, "DOUBLE"),
    ({"payload": {"after": {"dataColumn": {"paid": 1}}}}, "BOOLEAN"),
    ({"payload": {"after": {"dataColumn": {"raw": "not base64!"}}}}, "base64"),
    ({"payload": {"after": {"dataColumn": {"at": "2020-11-14"}}}}, "DATE"),
    ({"payload": {"after": {"dataColumn": {"at": 10**30}}}}, "DATE"),
    ({"payload": {"after": {"dataColumn": {"note": 5}}}}, "STRING"),
    ({"version": 2}, "version"),
])
def test_bad_foreign_messages_are_reported(bad, words):
    msg = message("INSERT", {"after": AFTER})
    for key, value in bad.items():
        msg[key] = {**msg[key], **value} if isinstance(msg.get(key), dict) and key == "payload" else value
    with pytest.raises(BridgeError) as info:
        list(bridge.blob_to_entries([msg]))
    assert isinstance(info.value, (BlobFormatError, ConversionError))
    assert words in str(info.value)


def test_ddl_without_text_is_reported():
    for ddl in ({}, None, {"text": 5}):
        with pytest.raises(BlobFormatError, match="ddl"):
            list(bridge.blob_to_entries([message("ALTER", {"ddl": ddl}, schema={"source": SOURCE})]))


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner,
                                                                                 max_size=2), max_leaves=4)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, prefix + (index,))


@given(foreign_messages(), st.data())
def test_damaged_messages_raise_only_bridge_errors(messages, data):
    """Any part of a valid message replaced by any JSON value: converted or a BridgeError."""
    target = data.draw(st.sampled_from(range(len(messages))))
    paths = [p for p in _paths(messages[target]) if p]
    path = data.draw(st.sampled_from(paths))
    node = messages[target]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = data.draw(_JSON)
    decoder = bridge.BlobDecoder()
    for msg in messages:
        try:
            for entry in decoder.feed(msg):
                entry.SerializeToString()
        except BridgeError:
            pass
    assert all(isinstance(err, ConversionError) for err in decoder.finish())


# ---- the DTS form read by an independent protobuf class ----------------------------------------

@pytest.fixture(scope="module")
def spec_classes(tmp_path_factory) -> SimpleNamespace:
    """Entry and friends compiled from the wire format's transcription (package spec_check), in a pool of
    their own: nothing shared with bridge.wire.subscribe_pb2."""
    return compile_spec(tmp_path_factory.mktemp("blob_spec_check"))


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_dts_form_reads_with_an_independent_protobuf_class(spec_classes, name):
    entries = list(bridge.blob_to_entries(SHAPES[name]))
    wire = pb.Entries(items=entries).SerializeToString()
    theirs = spec_classes.Entries.FromString(wire)
    ours = json_format.MessageToDict(pb.Entries(items=entries), preserving_proto_field_name=True)
    assert json_format.MessageToDict(theirs, preserving_proto_field_name=True) == ours
    assert theirs.SerializeToString() == wire
    assert list(pb.Entries.FromString(theirs.SerializeToString()).items) == entries


def test_independent_class_sees_the_documented_types(spec_classes):
    [entry] = bridge.blob_to_entries(SHAPES["insert"])
    theirs = spec_classes.Entry.FromString(entry.SerializeToString())
    as_dict = json_format.MessageToDict(theirs, preserving_proto_field_name=True)
    assert as_dict["header"]["messageType"] == "DML" and as_dict["header"]["sourceType"] == "MYSQL"
    columns = as_dict["event"]["dmlEvent"]["columns"]
    assert [c["originalType"] for c in columns] == ["bigint(20)", "double", "tinyint(1)", "longtext", "longblob",
                                                   "datetime(3)"]
    values = as_dict["event"]["dmlEvent"]["rows"][0]["newColumns"]
    assert [v.get("dataType", "NIL") for v in values] == ["INT64", "FLOAT64", "INT8", "NIL", "BYTES", "STRING"]


# ---- unpaired update halves -------------------------------------------------------------------

def half(op, seq, image):
    return message(op, {"before" if op == "UPDATE_BEFOR" else "after": image}, seq=seq)


def insert_message(seq):
    return message("INSERT", {"after": AFTER}, seq=seq)


@pytest.mark.parametrize("op, missing", [("UPDATE_BEFOR", "UPDATE_AFTER"), ("UPDATE_AFTER", "UPDATE_BEFOR")])
def test_an_unpaired_half_at_the_end_is_reported(op, missing):
    lone = half(op, "5000000", BEFORE if op == "UPDATE_BEFOR" else AFTER)
    with pytest.raises(ConversionError) as info:
        list(bridge.blob_to_entries([lone]))
    assert info.value.where["sequence_id"] == "5000000" and missing in str(info.value)
    decoder = bridge.BlobDecoder()
    assert decoder.feed(lone) == [] and decoder.pending_messages == 1
    [err] = decoder.finish()
    assert isinstance(err, ConversionError) and "5000000" in str(err) and missing in str(err)
    assert decoder.finish() == [] and decoder.pending_messages == 0


def test_halves_interleaved_with_other_messages_still_pair():
    stream = [half("UPDATE_BEFOR", "1000000", BEFORE), insert_message("2000000"), HEARTBEAT,
              half("UPDATE_AFTER", "1000000", AFTER)]
    entries = list(bridge.blob_to_entries(stream))
    assert [e.header.messageType for e in entries] == [pb.DML, pb.HEARTBEAT, pb.DML]
    update = entries[2]
    assert update.event.dmlEvent.dmlEventType == pb.UPDATE and update.header.seqId == 1
    [row] = update.event.dmlEvent.rows
    assert row.oldColumns[1].sv == "9.5" and row.newColumns[1].sv == "10.25"


def test_unpaired_halves_interleaved_with_other_messages_are_reported_not_dropped():
    stream = [half("UPDATE_BEFOR", "1000000", BEFORE), insert_message("2000000"),
              half("UPDATE_AFTER", "3000000", AFTER), HEARTBEAT]
    decoder = bridge.BlobDecoder()
    out = [e for msg in stream for e in decoder.feed(msg)]
    assert [e.header.messageType for e in out] == [pb.DML, pb.HEARTBEAT]
    errors = decoder.finish()
    assert sorted(err.where["sequence_id"] for err in errors) == ["1000000", "3000000"]
    assert all(isinstance(err, ConversionError) for err in errors)
    got = []
    with pytest.raises(ConversionError):
        for entry in bridge.blob_to_entries(stream):
            got.append(entry)
    assert len(got) == 2


def test_unpaired_halves_count_as_rejected_in_the_stream_tally():
    lines = [bridge.encode_blob(m) for m in (half("UPDATE_BEFOR", "1000000", BEFORE), insert_message("2000000"))]
    policy = ErrorPolicy("skip")
    out = list(blob_lines_to_entries(lines, policy))
    assert len(out) == 1
    assert (policy.tally.input, policy.tally.converted, policy.tally.rejected) == (2, 1, 1)
    assert policy.rejects[0]["sequence_id"] == "1000000"


def test_a_repeated_half_is_reported():
    decoder = bridge.BlobDecoder()
    decoder.feed(half("UPDATE_BEFOR", "1000000", BEFORE))
    with pytest.raises(ConversionError, match="UPDATE_BEFOR"):
        decoder.feed(half("UPDATE_BEFOR", "1000000", BEFORE))


def test_too_many_waiting_halves_are_reported_oldest_first():
    """A half pushed out of the pairing window is reported (raised, or kept for `finish`), not dropped."""
    decoder = bridge.BlobDecoder(max_pending=2)
    errors = []
    for seq in ("1000000", "2000000", "3000000"):
        try:
            decoder.feed(half("UPDATE_BEFOR", seq, BEFORE))
        except ConversionError as err:
            errors.append(err)
    errors += decoder.finish()
    assert all(isinstance(err, ConversionError) for err in errors)
    assert sorted(err.where["sequence_id"] for err in errors) == ["1000000", "2000000", "3000000"]
    first = next(err for err in errors if err.where["sequence_id"] == "1000000")
    assert "within 2 messages" in str(first)


def test_an_incomplete_multi_row_event_is_reported():
    e = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1605339932,
                                  seqId=12, schemaName="shop", tableName="t"))
    e.event.dmlEvent.columns.add(name="id", originalType="int(11)", isKey=True)
    for i in range(3):
        e.event.dmlEvent.rows.add().newColumns.add(dataType=pb.INT32, sv=str(i))
    messages = bridge.entry_to_blob(e)
    decoder = bridge.BlobDecoder()
    assert [x for m in messages[:2] for x in decoder.feed(m)] == []
    [err] = decoder.finish()
    assert isinstance(err, ConversionError) and "2 of 3" in str(err)
    assert list(bridge.blob_to_entries(messages)) == [e]


# ---- recorded files, both directions -----------------------------------------------------------

def golden_names():
    return sorted(p.name[: -len(".blob.jsonl")] for p in GOLDEN.glob("*.blob.jsonl"))


@pytest.mark.parametrize("name", golden_names())
def test_golden_blob_files_decode_to_the_sample_entries(name):
    policy = ErrorPolicy("fail")
    with open(GOLDEN / f"{name}.blob.jsonl", "rb") as fh:
        decoded = [entry for _, entry in blob_lines_to_entries(fh, policy)]
    expected = [entry for _, entry in dts_json_lines_to_entries(
        bridge.read_dts_json(SAMPLES / f"{name}.dts.jsonl"), ErrorPolicy("fail"))]
    assert [e.SerializeToString(deterministic=True) for e in decoded] == \
        [e.SerializeToString(deterministic=True) for e in expected]
    assert policy.tally.balanced() and policy.tally.rejected == 0


def test_golden_lines_are_what_encode_blob_writes():
    for name in golden_names():
        with open(GOLDEN / f"{name}.blob.jsonl", "rb") as fh:
            for raw in fh:
                assert bridge.encode_blob(bridge.decode_blob(raw)) + b"\n" == raw
                assert orjson.loads(raw)["payload"]["op"]


def _two_row_insert(seq_id: int = 9) -> pb.Entry:
    e = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1_700_000_000,
                                  schemaName="s", tableName="a", seqId=seq_id, gtid="g:1", position=4))
    e.event.dmlEvent.dmlEventType = pb.INSERT
    e.event.dmlEvent.columns.add(name="id", originalType="int(11)", isKey=True)
    for v in ("1", "2"):
        e.event.dmlEvent.rows.add().newColumns.add(dataType=pb.INT32, sv=v)
    return e


@pytest.mark.parametrize("change", ["gtid", "table", "position", "event_property", "row_count"])
def test_rows_of_one_event_differing_in_header_are_not_merged(change):
    """Two row messages of one seqId whose headers (or event properties) differ are two events, each
    incomplete and reported at the end: merging them would keep the first's header and silently
    drop what the second said."""
    import copy
    e = _two_row_insert()
    first, second = bridge.entry_to_blob(e)
    second = copy.deepcopy(second)
    if change == "gtid":
        second["dts"]["header"]["gtid"] = "g:2"
    elif change == "position":
        second["dts"]["header"]["position"] = 5
    elif change == "table":
        second["schema"]["source"]["tableName"] = "b"
    elif change == "row_count":  # row 1 of 3: with row 0 of 2 it would have made an Entry of 2
        second["dts"]["row"] = [1, 3]
    else:
        second["dts"]["event"] = {"properties": [["k", "v"]]}
    decoder = bridge.BlobDecoder()
    assert decoder.feed(first) == [] and decoder.feed(second) == []
    assert decoder.pending == 2
    errors = decoder.finish()
    assert [err.count for err in errors] == [1, 1]
    assert all(" 1 of " in str(err) for err in errors)
    # the unchanged pair still joins into the Entry it came from
    joined = bridge.BlobDecoder()
    assert joined.feed(first) == []
    assert joined.feed(bridge.entry_to_blob(e)[1]) == [e]


def _update_of_one_row() -> pb.Entry:
    e = _two_row_insert()
    e.event.dmlEvent.dmlEventType = pb.UPDATE
    del e.event.dmlEvent.rows[1:]
    e.event.dmlEvent.rows[0].oldColumns.add(dataType=pb.INT32, sv="0")
    return e


@pytest.mark.parametrize("change, words", [
    (lambda m: m["schema"]["source"].update(tableName="b"), "different tables"),
    (lambda m: m["dts"]["header"].update(gtid="g:2"), "different headers"),
    (lambda m: m["schema"].update(primaryKey=[]), "different column sets"),
])
def test_an_update_half_that_differs_from_its_partner_loses_neither(change, words):
    """A second half naming another table, carrying another header field or another column set is
    rejected; the first keeps waiting for its real partner and is reported at the end if none
    comes: both messages are accounted for."""
    import copy
    e = _update_of_one_row()
    before, after = bridge.entry_to_blob(e)
    stray = copy.deepcopy(after)
    change(stray)
    decoder = bridge.BlobDecoder()
    assert decoder.feed(before) == []
    with pytest.raises(ConversionError, match=words):
        decoder.feed(stray)
    assert decoder.pending == 1
    assert decoder.feed(after) == [e]  # the real partner still joins it
    stray_first = bridge.BlobDecoder()
    stray_first.feed(before)
    with pytest.raises(ConversionError, match=words):
        stray_first.feed(stray)
    [err] = stray_first.finish()
    assert "UPDATE_AFTER missing" in str(err)


def test_update_halves_differing_only_in_time_join():
    """A timestamp difference alone still joins (it travels as before.eventTime)."""
    import copy
    e = _update_of_one_row()
    before, after = bridge.entry_to_blob(e)
    later = copy.deepcopy(after)
    later["payload"]["timestamp"]["eventTime"] += 1000
    later["payload"]["timestamp"]["checkpointTime"] += 1000
    decoder = bridge.BlobDecoder()
    decoder.feed(before)
    [joined] = decoder.feed(later)
    assert joined.header.timestamp == e.header.timestamp + 1
    assert bridge.entry_to_blob(joined)[0]["payload"]["timestamp"] == before["payload"]["timestamp"]


# ---- feed_line: the schema-prefix shortcut must change nothing ----------------------------------

def _outcomes(lines, per_line) -> list:
    """Per line: the Entries' bytes it completes, or the error (type, text, where); then finish."""
    decoder = bridge.BlobDecoder()
    out = []
    for number, line in enumerate(lines, 1):
        try:
            out.append([e.SerializeToString() for e in per_line(decoder, line, number)])
        except BridgeError as err:
            out.append((type(err).__name__, str(err), sorted(err.where.items())))
    out.append([(str(err), err.count) for err in decoder.finish()])
    return out


def _whole(decoder, line, number):
    return decoder.feed(bridge.decode_blob(line, line=number), line=number, checked=True)


def _by_line(decoder, line, number):
    return decoder.feed_line(line, line=number)


def _sample_lines() -> list[bytes]:
    lines = []
    for name in golden_names():
        with open(GOLDEN / f"{name}.blob.jsonl", "rb") as fh:
            lines += [raw.rstrip(b"\n") for raw in fh if raw.strip()]
    return lines


def test_feed_line_matches_decode_blob_and_feed_on_the_golden_lines():
    lines = _sample_lines()
    assert len(lines) > 50
    assert _outcomes(lines, _by_line) == _outcomes(lines, _whole)


def test_feed_line_parses_only_the_rest_of_a_repeated_schema_and_still_sees_everything():
    """Lines repeating the last schema's bytes take the shortcut; a second "schema" key (JSON's last
    one wins), a broken tail, text input, a schema that differs in one byte or in its spacing, and
    an extra top-level key all come out as decode_blob + feed gives them."""
    lines = [line for line in _sample_lines() if b'"op":"INSERT"' in line]
    first = lines[0]
    schema_end = first.index(b',"payload":')
    other = orjson.loads(first)
    other["schema"]["source"]["tableName"] = "other_table"
    variants = [
        first,
        first,  # the shortcut
        first[:schema_end] + b',"schema":' + orjson.dumps(other["schema"]) + first[schema_end:],
        first[:-1] + b',"extra":[1,2]}',
        first[:-10],  # broken after the shared prefix: the error's column is the whole line's
        first[:schema_end] + b",}",  # `{ }` parses; the whole line does not
        first[:schema_end] + b", }",
        first.decode(),
        first.replace(b'"schema":{', b'"schema": {', 1),
        first.replace(b'"dbName":"', b'"dbName":"x', 1),
        first,
        b"[]",
        first,
    ]
    assert _outcomes(variants, _by_line) == _outcomes(variants, _whole)
    decoder = bridge.BlobDecoder()
    decoder.feed_line(first)
    assert decoder._schema_prefix is not None and first.startswith(decoder._schema_prefix)


@given(st.lists(foreign_messages(), min_size=1, max_size=6), st.data())
def test_feed_line_matches_decode_blob_and_feed_on_foreign_streams(streams, data):
    """DataWorks-shaped messages, several with one schema, some lines repeated or cut short."""
    lines = [orjson.dumps(m) for ms in streams for m in ms]
    if data.draw(st.booleans()):
        lines += lines[: data.draw(st.integers(0, len(lines)))]
    cut = data.draw(st.integers(0, len(lines) - 1))
    lines.insert(cut, lines[cut][: data.draw(st.integers(0, len(lines[cut])))])
    assert _outcomes(lines, _by_line) == _outcomes(lines, _whole)


def test_a_null_primary_key_comes_back_null():
    """`primaryKey: null` (outside the JSON Schema, but taken as no key columns) comes back as null,
    not as [] (which it used to become)."""
    messages = [message("INSERT", {"after": AFTER}, schema={**SCHEMA, "primaryKey": None})]
    entries = list(bridge.blob_to_entries(through_json(messages)))
    assert to_blob(entries) == through_json(messages)
    assert all(not c.isKey for c in entries[0].event.dmlEvent.columns)


_DDL_OPS = {"CREATE", "ALTER", "QUERY", "ERASE", "DROP", "TRUNCATE", "RENAME", "CINDEX", "DINDEX"}


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("extra", ["unused images", "ddl and an unknown key", "all"])
def test_what_the_op_does_not_read_comes_back(name, extra):
    """Images an op does not read (a `before` on an insert, an `after` on a delete or on either half
    of an update pair), a `ddl` on a message that is no DDL, and unknown payload keys all come back
    from Blob -> DTS -> Blob (lossless): the unused images used to vanish, and an unknown key
    used to push out the `ddl` of a begin, commit or heartbeat."""
    for index in range(len(SHAPES[name])):
        messages = through_json(SHAPES[name])
        payload = messages[index]["payload"]
        if extra in ("unused images", "all"):
            for key, value in (("before", {"dataColumn": {"zz": 1}}), ("after", [0, "x"])):
                payload.setdefault(key, value)
        if extra in ("ddl and an unknown key", "all"):
            if payload["op"] not in _DDL_OPS:
                payload.setdefault("ddl", {"text": "not a DDL"})
            payload["unknown"] = {"a": [1, None]}
        entries = [pb.Entry.FromString(e.SerializeToString())
                   for e in bridge.blob_to_entries(through_json(messages))]
        assert to_blob(entries) == through_json(messages)


_SWEEP_PATHS = [("schema", "source", "dbVersion"), ("schema", "source", "schemaName"), ("schema", "source", "dbName"),
                ("schema", "source", "tableName"), ("schema", "source", "dbType"), ("schema", "source"),
                ("schema", "primaryKey"), ("schema",), ("payload", "timestamp", "systemTime"),
                ("payload", "timestamp", "checkpointTime"), ("payload", "sequenceId"), ("payload", "ddl"),
                ("payload", "before"), ("payload", "after"), ("payload", "op"), ("version",)]
_SWEEP_VALUES = [None, "", 0, [], {}, False, True, 1.5, "x"]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_an_accepted_message_comes_back_exactly_whatever_a_field_holds(name):
    """Each field of each DataWorks shape set to null, empty, zero, false, true, a float or text:
    Blob -> DTS -> Blob either rejects the message with a BridgeError or gives back the same
    document. Nothing in between: no value silently dropped or changed."""
    checked = 0
    for path in _SWEEP_PATHS:
        for value in _SWEEP_VALUES:
            for index in range(len(SHAPES[name])):
                messages = through_json(SHAPES[name])
                parent = messages[index]
                for key in path[:-1]:
                    parent = parent.get(key) if isinstance(parent, dict) else None
                if not isinstance(parent, dict) or path[-1] not in parent:
                    continue
                parent[path[-1]] = value
                try:
                    entries = [pb.Entry.FromString(e.SerializeToString())
                               for e in bridge.blob_to_entries(through_json(messages))]
                except BridgeError:
                    continue
                assert to_blob(entries) == through_json(messages), (path, value, index)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("value, ok", [(True, True), (False, True), (-1, False), (1, False), (0, False)])
def test_a_boolean_of_the_extension_must_be_a_json_boolean(value, ok):
    """protobuf would take any int for a bool field (-1 as true) and the message would come back
    saying `true`: the extension's booleans must be JSON booleans."""
    e = _two_row_insert()
    del e.event.dmlEvent.rows[1:]
    e.header.isLast = True
    [msg] = bridge.entry_to_blob(e)
    msg["dts"]["header"]["isLast"] = value
    if ok:
        [back] = bridge.BlobDecoder().feed(msg)
        assert back.header.isLast is value
    else:
        with pytest.raises(BlobFormatError, match="isLast"):
            bridge.BlobDecoder().feed(msg)


_UNKNOWN = base64.b64encode(b"\x30\x05").decode()  # field 6, a varint: unknown in an Entry, a Header, a Data...


@pytest.mark.parametrize("change", [
    lambda ext: ext.update(extra=1),
    lambda ext: ext.update(unknown=1),
    lambda ext: ext.update(unknown={"header": "not base64"}),
    lambda ext: ext.update(unknown={"header": ""}),
    lambda ext: ext.update(unknown={"header": base64.b64encode(b"\x08\x05").decode()}),  # version: a known field
    lambda ext: ext.update(unknown={"header": base64.b64encode(b"\x30").decode()}),  # a truncated field
    lambda ext: ext.update(unknown={"": _UNKNOWN}),
    lambda ext: ext.update(unknown={"entry.header": _UNKNOWN}),
    lambda ext: ext.update(unknown={"header.version": _UNKNOWN}),  # no message
    lambda ext: ext.update(unknown={"header.properties": _UNKNOWN}),  # a list without an index
    lambda ext: ext.update(unknown={"header.properties.0": _UNKNOWN}),  # no such pair
    lambda ext: ext.update(unknown={"event.beginEvent": _UNKNOWN}),  # not in a DML Entry
    lambda ext: ext.update(unknown={"event.dmlEvent.rows.0": _UNKNOWN}),  # a row's are "row..."
    lambda ext: ext.update(unknown={"event.dmlEvent.columns.2": _UNKNOWN}),  # two columns
    lambda ext: ext.update(unknown={"row.oldColumns.0": _UNKNOWN}),  # an insert has no before image
    lambda ext: ext.update(unknown={"row.newColumns.2": _UNKNOWN}),
    lambda ext: ext.update(unknown={"row.properties.0": _UNKNOWN}),
    lambda ext: ext.update(unknown={"row.newColumns.x": _UNKNOWN}),
    lambda ext: ext.update(values="x"),
    lambda ext: ext.update(values={"7": {"dataType": "STRING", "sv": "a"}}),  # no column 7
    lambda ext: ext.update(charsets={"x": "utf8"}),
    lambda ext: ext.update(rowProperties={"k": "v"}),
    lambda ext: ext.update(image="full"),
    lambda ext: ext.update(row=[1, 1]),
    lambda ext: ext.update(row=[0, True]),
    lambda ext: ext.update(row=[0]),
    lambda ext: ext.update(event={"transactionId": "t"}),  # a DML event holds only properties
    lambda ext: ext.update(columns={**ext["columns"], "extra": 1}),
    lambda ext: ext.update(columns={"properties": {}}),
    lambda ext: ext.update(header=None),
])
def test_a_dts_extension_the_bridge_would_not_write_is_an_error(change):
    """Read leniently, each of these was dropped or misread and the message came back different."""
    e = _two_row_insert()
    del e.event.dmlEvent.rows[1:]
    [msg] = bridge.entry_to_blob(e)
    assert bridge.BlobDecoder().feed(copy.deepcopy(msg)) == [e]
    change(msg["dts"])
    with pytest.raises(BlobFormatError, match="extension"):
        bridge.BlobDecoder().feed(msg)


def test_a_dml_part_of_the_dts_extension_on_another_message_is_an_error():
    begin = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.BEGIN, timestamp=1_700_000_000,
                                      seqId=4, gtid="g:1"))
    begin.event.beginEvent.transactionId = "t1"
    [msg] = bridge.entry_to_blob(begin)
    assert bridge.BlobDecoder().feed(copy.deepcopy(msg)) == [begin]
    msg["dts"]["row"] = [0, 1]
    with pytest.raises(BlobFormatError, match="extension"):
        bridge.BlobDecoder().feed(msg)


def test_unknown_fields_come_back_and_a_before_half_holds_only_its_image_s():
    """Unknown protobuf fields survive DTS -> Blob -> DTS (in `dts.unknown`, by the
    message holding them); an update's before half carries its image's, the after half the row's
    own, and a before half naming the row itself is not what the bridge writes."""
    e = _update_of_one_row()
    e.MergeFromString(b"\x30\x05")
    e.event.dmlEvent.rows[0].MergeFromString(b"\x28\x01")
    e.event.dmlEvent.rows[0].oldColumns[0].MergeFromString(b"\x28\x02")
    before, after = bridge.entry_to_blob(e)
    assert before["dts"]["unknown"] == {"entry": _UNKNOWN, "row.oldColumns.0": base64.b64encode(b"\x28\x02").decode()}
    assert after["dts"]["unknown"] == {"entry": _UNKNOWN, "row": base64.b64encode(b"\x28\x01").decode()}
    for order in ([before, after], [after, before]):
        decoder = bridge.BlobDecoder()
        back = [x for m in through_json(order) for x in decoder.feed(m)]
        assert [x.SerializeToString() for x in back] == [e.SerializeToString()]
    wrong = copy.deepcopy(before)
    wrong["dts"]["unknown"]["row"] = wrong["dts"]["unknown"].pop("row.oldColumns.0")
    with pytest.raises(BlobFormatError, match="does not hold"):
        bridge.BlobDecoder().feed(wrong)
    other = copy.deepcopy(after)
    del other["dts"]["unknown"]["entry"]
    decoder = bridge.BlobDecoder()
    decoder.feed(copy.deepcopy(before))
    with pytest.raises(ConversionError, match="different unknown fields"):
        decoder.feed(other)
    assert decoder.pending_messages == 1  # the waiting half keeps waiting


@pytest.mark.parametrize("options", [Options(strict=True), Options()], ids=["strict", "lossless"])
@pytest.mark.parametrize("native", [False, True], ids=["python", "c"])
@pytest.mark.parametrize("as_lines", [False, True], ids=["feed", "feed_line"])
def test_an_update_whose_before_half_comes_second_keeps_its_row(options, native, as_lines):
    """The after half first, then the before half, of single-row updates without a `dts`
    extension (strict lines, or lossless lines that have none): each completed Entry holds its
    row, as when the halves come in order. (The Python path once appended the row to the event it
    had before the waiting half's Entry was copied in, and gave an Entry without rows.)"""
    entries = []
    for seq in (7, 8):
        entry = pb.Entry(header=pb.Header(messageType=pb.DML, seqId=seq, timestamp=1700000000 + seq,
                                          schemaName="shop", tableName="t", sourceType=pb.MYSQL, version=1))
        dml = entry.event.dmlEvent
        dml.dmlEventType = pb.UPDATE
        dml.columns.add(name="id", originalType="int(11)", isKey=True)
        dml.columns.add(name="name", originalType="varchar(8)")
        row = dml.rows.add()
        row.oldColumns.add(dataType=pb.INT32, sv=str(seq))
        row.oldColumns.add(dataType=pb.STRING, charset="utf8mb4", bv=b"old")
        row.newColumns.add(dataType=pb.INT32, sv=str(seq))
        row.newColumns.add(dataType=pb.STRING, charset="utf8mb4", bv=b"new")
        entries.append(entry)
    halves = []
    for entry in entries:
        before, after = bridge.BlobEncoder(options).convert(entry)
        for msg in (before, after):
            msg.pop("dts", None)
        halves.append((before, after))

    def decode(order):
        decoder = bridge.BlobDecoder(options)
        decoder._native = native
        feed = (lambda m: decoder.feed_line(orjson.dumps(m))) if as_lines else \
            (lambda m: decoder.feed(copy.deepcopy(m)))
        got = [e.SerializeToString() for pair in halves for msg in order(pair) for e in feed(msg)]
        assert decoder.finish() == []
        return got

    in_order, after_first = decode(lambda pair: pair), decode(lambda pair: pair[::-1])
    assert [len(pb.Entry.FromString(e).event.dmlEvent.rows) for e in after_first] == [1, 1]
    assert after_first == in_order


@pytest.mark.parametrize("where", ["header", "event", "rowProperties", "columns"])
@pytest.mark.parametrize("pair", [["k", None], [None, "v"], ["k", 1], ["k", True]])
def test_extension_properties_hold_strings_only(where, pair):
    """A property whose key or value is not a string (null included: protobuf would store an
    empty string) is the library's error, on every path, and never a changed value."""
    entry = pb.Entry(header=pb.Header(messageType=pb.DML, seqId=3, timestamp=1700000000, schemaName="shop",
                                      tableName="t", sourceType=pb.MYSQL, version=1))
    dml = entry.event.dmlEvent
    dml.columns.add(name="id", originalType="int(11)", isKey=True)
    dml.rows.add().newColumns.add(dataType=pb.INT64, sv="1")
    entry.header.properties.add(key="a", value="b")
    entry.event.properties.add(key="a", value="b")
    dml.rows[0].properties.add(key="a", value="b")
    dml.columns[0].properties.add(key="a", value="b")
    (msg,) = bridge.BlobEncoder(Options()).convert(entry)
    ext = msg["dts"]
    target = {"header": lambda: ext["header"]["properties"], "event": lambda: ext["event"]["properties"],
              "rowProperties": lambda: ext["rowProperties"], "columns": lambda: ext["columns"]["properties"]["0"]}
    target[where]()[0] = pair
    for native in (False, True):
        decoder = bridge.BlobDecoder(Options())
        decoder._native = native
        with pytest.raises(BlobFormatError, match="pairs of strings"):
            decoder.feed_line(orjson.dumps(msg))


# ---- an update whose halves differ in whether they carry the extension ---------------------------

def _foreign_update(before: pb.Data, after: pb.Data) -> pb.Entry:
    """A one-row UPDATE of a table whose column types are the ones a message without the extension
    decodes to (bigint(20), datetime(3)): a half that needs nothing of the extension leaves it out."""
    e = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1621236162,
                                  seqId=1, schemaName="shop", tableName="t"))
    dml = e.event.dmlEvent
    dml.dmlEventType = pb.UPDATE
    dml.columns.add(name="id", originalType="bigint(20)", isKey=True)
    dml.columns.add(name="c", originalType="datetime(3)")
    row = dml.rows.add()
    row.oldColumns.extend([pb.Data(dataType=pb.INT64, sv="1"), before])
    row.newColumns.extend([pb.Data(dataType=pb.INT64, sv="1"), after])
    return e


_PLAIN_DT3 = pb.Data(dataType=pb.STRING, bv=b"2021-05-17 07:22:42.123")
_NEEDS_DTS = {"label": pb.Data(dataType=pb.STRING, charset="binary", bv=b"2021-05-17 07:22:42.123"),
              "raw": pb.Data(dataType=pb.STRING, bv=b"2021-05-17 07:22:42.1234")}


@pytest.mark.parametrize("native", [True, False], ids=["c-lane", "python"])
@pytest.mark.parametrize("order", ["in-order", "after-first"])
@pytest.mark.parametrize("half", ["before", "after"])
@pytest.mark.parametrize("kind", sorted(_NEEDS_DTS))
def test_update_halves_join_when_only_one_carries_the_extension(kind, half, order, native):
    """The encoder leaves the extension out of a half that says nothing new; its partner that
    needs one (a charset label, a raw value) has it. Their column sets are the same, so they join
    (they were refused as "different column sets" until session 10), with either path, in either
    order, and the Entry comes back byte for byte."""
    special = _NEEDS_DTS[kind]
    entry = _foreign_update(special, _PLAIN_DT3) if half == "before" else _foreign_update(_PLAIN_DT3, special)
    raw = entry.SerializeToString()
    lines = bridge.BlobEncoder().convert_lines(entry, raw)
    assert [b'"dts"' in line for line in lines] == ([True, False] if half == "before" else [False, True])
    decoder = bridge.BlobDecoder()
    decoder._native = native
    got = [e.SerializeToString() for line in (lines if order == "in-order" else lines[::-1])
           for e in decoder.feed_line(line)]
    assert got == [raw]
    assert decoder.finish() == []


def test_update_halves_with_different_columns_are_still_refused():
    """The columns decide when the keys differ: a datetime(6) half does not join a datetime(3) one."""
    entry = _foreign_update(_NEEDS_DTS["label"], _PLAIN_DT3)
    lines = bridge.BlobEncoder().convert_lines(entry, entry.SerializeToString())
    other = orjson.loads(lines[0])
    other["dts"]["columns"]["types"][1] = "datetime(6)"
    decoder = bridge.BlobDecoder()
    assert decoder.feed_line(orjson.dumps(other)) == []
    with pytest.raises(ConversionError, match="different column sets"):
        decoder.feed_line(lines[1])
