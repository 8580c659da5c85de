"""The Blob round-trip laws, property-tested with hypothesis.

1. DTS -> Blob -> DTS (lossless) gives back byte-identical Entries (stream form: several Entries,
   multi-row events, update pairs, every MessageType), whatever the time zone and decimal option.
2. Blob -> DTS -> Blob gives back an equal JSON document, for foreign (DataWorks-shaped) messages
   and for messages the bridge itself wrote, after a trip through JSON bytes.
4. Strict mode: DTS -> Blob(strict) -> DTS(strict) equals the input after `strict_normal_form`, and
   Blob -> DTS(strict) -> Blob(strict) equals the input after `strict_blob_normal_form`; both
   normalisations are spelled out in docs/mapping.md ("Strict mode").
5. Every Blob message the bridge writes validates (`bridge.validate_blob`) in both modes.

The number of examples comes from the hypothesis profile (tests/conftest.py): "quick" by default,
"deep" (10,000 per law) with HYPOTHESIS_PROFILE=deep; every property carries the `deep` marker
(`pytest -m deep` runs just the laws).
"""
from __future__ import annotations

import base64

import orjson
import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st

import bridge
from bridge import ConversionError, Options, pb
from bridge.values import ddl_op
from support.blob_strategies import blob_dml_entries, blob_entries, blob_entry_streams, foreign_streams
from support.strategies import with_unknown_fields
from support.strict_form import strict_normal_form, through_json

RESERVED = "datahub:"

# Options under which the lossless laws must hold (every inexact value travels in the extension).
LOSSLESS_OPTIONS = [Options(), Options(timezone="Asia/Shanghai", decimal="double"),
                    Options(timezone="America/New_York"), Options(control_events="emit", db_version="5.7.34")]
# strict mode with the temporal policies that report (law 4's model below); the defaults (null, truncate)
# have their law in tests/test_temporal_policies.py
STRICT = Options(strict=True, zero_dates="error", temporal_precision="exact")
ALL_OPTIONS = LOSSLESS_OPTIONS + [STRICT, STRICT.replace(decimal="double", timezone="Asia/Kolkata")]


def as_dicts(entries) -> list[dict]:
    return [json_format.MessageToDict(e, preserving_proto_field_name=True) for e in entries]


def wire_bytes(entries) -> list[bytes]:
    return [e.SerializeToString(deterministic=True) for e in entries]


def reserved_keys(entry: pb.Entry) -> list[str]:
    """Every `datahub:` property key anywhere in an Entry."""
    lists = [entry.header.properties, entry.event.properties]
    lists += [c.properties for c in entry.event.dmlEvent.columns]
    lists += [r.properties for r in entry.event.dmlEvent.rows]
    return [p.key for props in lists for p in props if p.key.startswith(RESERVED)]


def to_blob(entries, options) -> list[dict]:
    encoder = bridge.BlobEncoder(options)
    return [m for e in entries for m in encoder.convert(e)]


# ---- Law 1 ---------------------------------------------------------------------------------

@pytest.mark.deep
@given(blob_entry_streams(max_size=6), st.sampled_from(LOSSLESS_OPTIONS))
def test_law1_dts_blob_dts_gives_back_byte_identical_entries(stream, options):
    messages = through_json(to_blob(stream, options))
    back = list(bridge.blob_to_entries(messages, options))
    assert as_dicts(back) == as_dicts(stream)
    assert wire_bytes(back) == wire_bytes(stream)


def _one_table(entry: pb.Entry) -> pb.Entry:
    entry.header.schemaName, entry.header.tableName = "shop", "orders"
    return entry


@pytest.mark.deep
@given(blob_entry_streams(min_size=2, max_size=6, elements=blob_dml_entries().map(_one_table)),
       st.sampled_from(LOSSLESS_OPTIONS[:2]))
def test_law1_holds_when_one_table_changes_its_columns(stream, options):
    """Every DML Entry names the same table but brings its own column set (as after ALTER TABLE):
    nothing cached for one column set may leak into the next."""
    messages = through_json(to_blob(stream, options))
    assert wire_bytes(bridge.blob_to_entries(messages, options)) == wire_bytes(stream)
    shared = bridge.BlobEncoder(options)
    for entry in stream:
        assert shared.convert(entry) == bridge.BlobEncoder(options).convert(entry)


@pytest.mark.deep
@given(blob_entry_streams(min_size=2, max_size=5))
def test_law1_holds_one_message_at_a_time_through_the_stream_decoder(stream):
    """Feeding messages one by one gives each Entry as soon as its last message arrives."""
    decoder = bridge.BlobDecoder()
    encoder = bridge.BlobEncoder()
    for entry in stream:
        out = []
        for msg in through_json(encoder.convert(entry)):
            out += decoder.feed(msg)
        assert wire_bytes(out) == wire_bytes([entry])
        assert decoder.pending_messages == 0
    assert decoder.finish() == []


@pytest.mark.deep
@given(blob_entry_streams(min_size=1, max_size=4, elements=with_unknown_fields(blob_entries())),
       st.sampled_from(LOSSLESS_OPTIONS[:2]))
def test_law1_holds_for_entries_with_unknown_fields(stream, options):
    """Unknown fields (an undeclared field number, or a declared one of another
    wire type, in any message of the Entry) survive DTS -> Blob -> DTS byte for byte. They travel
    in `dts.unknown`; the C fast path leaves such Entries to Python, and the decoder puts them back
    with its C image encoder and without it. Blob -> DTS -> Blob gives the same lines again."""
    raws = [e.SerializeToString() for e in stream]
    for with_raw in (False, True):
        encoder = bridge.BlobEncoder(options)
        lines = [line for raw in raws for line in encoder.convert_lines(pb.Entry.FromString(raw), raw if with_raw
                                                                        else None)]
        for line in lines:
            bridge.validate_blob(orjson.loads(line))
        for native in (True, False):
            decoder = bridge.BlobDecoder(options)
            decoder._native = native
            back = [e for line in lines for e in decoder.feed_line(line)]
            assert decoder.finish() == []
            assert wire_bytes(back) == wire_bytes(stream)
            again = bridge.BlobEncoder(options)
            assert [line for e in back for line in again.convert_lines(e, e.SerializeToString())] == lines


# ---- Law 2 ---------------------------------------------------------------------------------

def test_law2_foreign_round_trip_example():
    """A DataWorks insert with a millisecond eventTime and a systemTime comes back unchanged."""
    msg = {"schema": {"dataColumn": [{"name": "id", "type": "LONG"}, {"name": "ok", "type": "BOOLEAN"}],
                      "primaryKey": ["id"],
                      "source": {"dbType": "MySQL", "dbVersion": "5.7.34-log", "dbName": "shop",
                                 "schemaName": "shop", "tableName": "orders"}},
           "payload": {"before": None, "after": {"dataColumn": {"id": 1, "ok": True}}, "op": "INSERT",
                       "sequenceId": "1605339516000000004",
                       "timestamp": {"eventTime": 1605339932123, "systemTime": 1605339932736,
                                     "checkpointTime": 1605339932123},
                       "ddl": None},
           "version": "0.0.1"}
    entries = list(bridge.blob_to_entries([msg]))
    assert through_json(to_blob(entries, Options())) == [msg]


@pytest.mark.deep
@given(foreign_streams())
def test_law2_foreign_blob_dts_blob_gives_back_equal_documents(messages):
    entries = list(bridge.blob_to_entries(through_json(messages)))
    entries = [pb.Entry.FromString(e.SerializeToString()) for e in entries]  # over the DTS wire
    assert through_json(to_blob(entries, Options())) == messages


@pytest.mark.deep
@given(foreign_streams())
def test_law2_foreign_round_trip_with_a_strict_encoder(messages):
    """The DataHub facts alone (`datahub:*` properties) restore every documented field."""
    entries = list(bridge.blob_to_entries(through_json(messages)))
    assert through_json(to_blob(entries, STRICT)) == messages


@pytest.mark.deep
@given(blob_entry_streams(max_size=6), st.sampled_from(LOSSLESS_OPTIONS))
def test_law2_bridge_written_lossless_messages_round_trip(stream, options):
    messages = through_json(to_blob(stream, options))
    entries = list(bridge.blob_to_entries(messages, options))
    assert through_json(to_blob(entries, options)) == messages


def strict_messages(stream, options=STRICT) -> list[dict]:
    """Strict messages of the Entries strict mode can convert (the others are Law 4's business)."""
    encoder = bridge.BlobEncoder(options)
    out = []
    for entry in stream:
        try:
            out += encoder.convert(entry)
        except ConversionError:
            continue
    return through_json(out)


@pytest.mark.deep
@given(blob_entry_streams(max_size=6))
def test_law2_bridge_written_strict_messages_round_trip(stream):
    messages = strict_messages(stream)
    entries = list(bridge.blob_to_entries(messages))
    assert through_json(to_blob(entries, Options())) == messages


# ---- Law 4: strict mode, up to a normalisation (docs/mapping.md, "Strict mode") --------------

@pytest.mark.deep
@given(blob_entries())
def test_law4_dts_strict_blob_dts_equals_the_normal_form(entry):
    expected = strict_normal_form(entry)
    if expected is None:
        with pytest.raises(ConversionError):
            bridge.entry_to_blob(entry, STRICT)
        return
    messages = through_json(bridge.entry_to_blob(entry, STRICT))
    assert all("dts" not in m for m in messages)
    back = list(bridge.blob_to_entries(messages, STRICT))
    assert as_dicts(back) == as_dicts(expected)


def test_law4_normal_form_example():
    """A gbk varchar, a UINT64, a decimal and a TIMESTAMP with an offset, by hand."""
    e = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1621236162,
                                  serverId=7, gtid="g:1", schemaName="shop", tableName="t", seqId=42))
    e.event.dmlEvent.dmlEventType = pb.INSERT
    for name, type_text, key in [("id", "bigint(20) unsigned", True), ("name", "varchar(8)", False),
                                 ("price", "decimal(10,2)", False), ("at", "timestamp(3)", False)]:
        e.event.dmlEvent.columns.add(name=name, originalType=type_text, isKey=key)
    e.event.dmlEvent.rows.add().newColumns.extend([
        pb.Data(dataType=pb.UINT64, sv="18446744073709551615"),
        pb.Data(dataType=pb.STRING, charset="gbk", bv="中文".encode("gbk")),
        pb.Data(dataType=pb.DECIMAL, sv="-12.50"),
        pb.Data(dataType=pb.STRING, bv=b"2021-05-17 15:22:42.123 +08:00")])
    back = list(bridge.blob_to_entries(bridge.entry_to_blob(e, STRICT), STRICT))
    assert as_dicts(back) == as_dicts(strict_normal_form(e))
    row = back[0].event.dmlEvent.rows[0].newColumns
    assert [c.originalType for c in back[0].event.dmlEvent.columns] == ["longtext", "longtext", "longtext",
                                                                        "datetime(3)"]
    assert row[1] == pb.Data(dataType=pb.STRING, charset="utf8mb4", bv="中文".encode())
    assert row[3] == pb.Data(dataType=pb.STRING, bv=b"2021-05-17 07:22:42.123")


def strict_blob_normal_form(messages: list[dict]) -> list[dict]:
    """What Blob -> DTS(strict) -> Blob(strict) gives for foreign messages: the documented fields
    a DTS Entry can hold. sequenceId becomes seqId * 10**6 (seqId = sequenceId // 10**6, 0 when
    that overflows uint64), eventTime is floored to the second and checkpointTime equals it,
    systemTime goes, version is "0.0.1", source is rebuilt (known dbType or MySQL, schemaName =
    dbName, no dbVersion), primaryKey follows column order (and is [] when absent), BOOLEAN
    columns become LONG 0/1, null images and `ddl: null` go, ddlMeta goes, a DDL op is the one
    its text says, one UPDATE message becomes an UPDATE_BEFOR/UPDATE_AFTER pair, and both halves
    of a pair take the UPDATE_AFTER's time."""
    known = {"mysql": "MySQL", "oracle": "Oracle", "postgresql": "PostgreSQL", "mariadb": "MariaDB"}
    out = []
    after_stamp = {}
    for msg in messages:
        if msg["payload"]["op"] == "UPDATE_AFTER":
            after_stamp[msg["payload"]["sequenceId"]] = msg["payload"]["timestamp"]
    for msg in messages:
        payload = msg["payload"]
        seq = int(payload["sequenceId"]) // 10**6
        seq = 0 if seq >= 2**64 else seq
        stamp = after_stamp.get(payload["sequenceId"], payload["timestamp"]) \
            if payload["op"] == "UPDATE_BEFOR" else payload["timestamp"]
        seconds = stamp["eventTime"] - stamp["eventTime"] % 1000
        new_payload = {"op": payload["op"], "sequenceId": str(seq * 10**6),
                       "timestamp": {"eventTime": seconds, "checkpointTime": seconds}}
        schema = msg["schema"]
        new_schema = {}
        source = schema.get("source")
        if source is not None and ("dataColumn" in schema or "ddl" in payload and payload["ddl"]):
            new_schema["source"] = {"dbType": known.get(source["dbType"].lower(), "MySQL"),
                                    "dbName": source["dbName"], "schemaName": source["dbName"],
                                    "tableName": source["tableName"]}
        if "dataColumn" in schema:
            columns = [{"name": c["name"], "type": "LONG" if c["type"] == "BOOLEAN" else c["type"]}
                       for c in schema["dataColumn"]]
            keys = set(schema.get("primaryKey") or [])
            new_schema = {"dataColumn": columns, "primaryKey": [c["name"] for c in columns if c["name"] in keys],
                          "source": new_schema["source"]}

            def image(name):
                values = payload[name]["dataColumn"]
                return {"dataColumn": {k: int(v) if isinstance(v, bool) else v for k, v in values.items()}}

            halves = {"INSERT": [("INSERT", "after")], "DELETE": [("DELETE", "before")],
                      "UPDATE_BEFOR": [("UPDATE_BEFOR", "before")], "UPDATE_AFTER": [("UPDATE_AFTER", "after")],
                      "UPDATE": [("UPDATE_BEFOR", "before"), ("UPDATE_AFTER", "after")]}[payload["op"]]
            for op, name in halves:
                half = {name: image(name), **new_payload, "op": op}
                out.append({"schema": new_schema, "payload": half, "version": "0.0.1"})
            continue
        if payload.get("ddl"):
            new_payload["op"] = ddl_op(payload["ddl"]["text"])
            new_payload["ddl"] = {"text": payload["ddl"]["text"]}
        out.append({"schema": new_schema, "payload": new_payload, "version": "0.0.1"})
    return out


@pytest.mark.deep
@given(foreign_streams())
def test_law4_blob_strict_dts_blob_equals_the_normal_form(messages):
    entries = list(bridge.blob_to_entries(through_json(messages), STRICT))
    assert through_json(to_blob(entries, STRICT)) == strict_blob_normal_form(messages)


@pytest.mark.deep
@given(foreign_streams())
def test_law4_strict_decoding_writes_no_reserved_properties(messages):
    """`strict`: "no 'dts' extension, no reserved properties" (bridge/options.py)."""
    for entry in bridge.blob_to_entries(through_json(messages), STRICT):
        assert not reserved_keys(entry), json_format.MessageToDict(entry)


# ---- Law 5 ---------------------------------------------------------------------------------

@pytest.mark.deep
@given(blob_entries(), st.sampled_from(ALL_OPTIONS))
def test_law5_every_message_the_bridge_writes_validates(entry, options):
    try:
        messages = bridge.entry_to_blob(entry, options)
    except ConversionError:
        assert options.strict, "lossless mode carries every value; it must not reject a canonical Entry"
        return
    for msg in messages:
        bridge.validate_blob(msg)
        bridge.validate_blob(orjson.loads(bridge.encode_blob(msg)))
        if options.strict:
            assert "dts" not in msg


@pytest.mark.deep
@given(foreign_streams())
def test_law5_messages_rebuilt_from_foreign_ones_validate(messages):
    for msg in messages:
        bridge.validate_blob(msg)  # the strategy writes valid messages
    entries = list(bridge.blob_to_entries(messages))
    for options in (Options(), STRICT):
        for msg in to_blob(entries, options):
            bridge.validate_blob(msg)


def test_base64_of_strict_bytes_is_standard():
    """BYTES values are standard base64 with padding (docs/mapping.md, "Column types")."""
    e = pb.Entry(header=pb.Header(messageType=pb.DML, timestamp=1621236162, seqId=1, schemaName="s", tableName="t"))
    e.event.dmlEvent.columns.add(name="b", originalType="blob")
    e.event.dmlEvent.rows.add().newColumns.add(dataType=pb.BYTES, bv=b"\xfb\xff")
    [msg] = bridge.entry_to_blob(e, STRICT)
    assert msg["payload"]["after"]["dataColumn"]["b"] == base64.b64encode(b"\xfb\xff").decode() == "+/8="
