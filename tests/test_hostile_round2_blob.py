"""Issue 29, the Blob side: reserved-prefix properties in DTS input, Events without their
sub-message, and the bound on one Blob line (docs/decisions.md, "Reserved-prefix properties in DTS
input", "Events without their sub-message", "One Blob line's memory").

* A `datahub:` key in an Entry's header, row, column or event properties is the bridge's DataHub
  fact only where and as the bridge writes it (`facts_hold`); anywhere else it is the Entry's own
  property and DTS -> Blob -> DTS keeps it byte for byte, on the C path and the Python path alike.
  A Blob message whose extension holds such keys that would read as facts is a named rejection.
* A non-DML Entry whose Event lacks its sub-message (or the Event itself) comes back exactly.
* `BlobDecoder.feed_line` refuses a line over `max_line_bytes`, and a JSON text that is no object,
  before parsing it.
"""
from __future__ import annotations

import tracemalloc

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bridge
from bridge import BlobFormatError, ConversionError, Options, pb
from bridge.blob.decode import BlobDecoder
from bridge.blob.encode import facts_hold
from bridge.errors import LineTooLongError
from bridge.options import DEFAULT_OPTIONS
from bridge.stream import ErrorPolicy, blob_lines_to_entries, decoder_entries
from bridge.wire.framing import DEFAULT_MAX_LINE_BYTES
from support.blob_strategies import blob_entries
from support.native_paths import assert_same

FACT_NAMES = ("sequenceId", "eventTime", "systemTime", "checkpointTime", "dbVersion", "source", "schema",
              "primaryKey", "op", "nullImage", "ddlNull", "ddlMeta", "version", "payloadExtra", "extra",
              "before.eventTime", "type", "foo", "")


def round_trip(entry: pb.Entry, options: Options = DEFAULT_OPTIONS) -> tuple[list[bytes], list[pb.Entry]]:
    """DTS -> Blob lines -> DTS, through the line API both ways."""
    lines = bridge.entries_to_blob_lines(pb.Entries(items=[entry]).SerializeToString(), options)
    decoder = BlobDecoder(options)
    back = [e for line in lines for e in decoder.feed_line(line)]
    assert decoder.finish() == []
    return lines, back


def assert_exact(entry: pb.Entry, options: Options = DEFAULT_OPTIONS) -> list[bytes]:
    lines, back = round_trip(entry, options)
    assert [e.SerializeToString() for e in back] == [entry.SerializeToString()], lines
    return lines


def dml(dml_type=pb.DELETE, nrows: int = 1) -> pb.Entry:
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1605339932,
                                      seqId=9, schemaName="d", tableName="t"))
    event = entry.event.dmlEvent
    event.dmlEventType = dml_type
    event.columns.add(name="id", originalType="int(11)", isKey=True)
    event.columns.add(name="ok", originalType="tinyint(1)")
    for i in range(nrows):
        row = event.rows.add()
        if dml_type != pb.INSERT:
            row.oldColumns.extend([pb.Data(dataType=pb.INT32, sv=str(i)), pb.Data(dataType=pb.INT8, sv="1")])
        if dml_type != pb.DELETE:
            row.newColumns.extend([pb.Data(dataType=pb.INT32, sv=str(i + 1)), pb.Data(dataType=pb.INT8, sv="0")])
    return entry


def heartbeat() -> pb.Entry:
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.HEARTBEAT,
                                      timestamp=1605339932, seqId=9))
    entry.event.heartbeatEvent.SetInParent()
    return entry


# ---- finding 1 (and 6's wider part): reserved-prefix keys in DTS input --------------------------

def test_a_datahub_event_time_on_a_delete_header_is_an_ordinary_property():
    """The issue's case: it rewrote eventTime and moved to the row properties on the way back."""
    entry = dml()
    entry.header.properties.add(key="datahub:eventTime", value="1700000000123")
    [line] = assert_exact(entry)
    msg = orjson.loads(line)
    assert msg["payload"]["timestamp"]["eventTime"] == 1605339932000
    assert msg["dts"]["header"]["properties"] == [["datahub:eventTime", "1700000000123"]]


def test_a_datahub_op_insert_on_a_delete_header_keeps_the_delete():
    entry = dml()
    entry.header.properties.add(key="datahub:op", value="INSERT")
    [line] = assert_exact(entry)
    payload = orjson.loads(line)["payload"]
    assert payload["op"] == "DELETE" and "before" in payload and "after" not in payload


def test_a_datahub_op_update_on_an_update_header_keeps_its_two_halves():
    entry = dml(pb.UPDATE, nrows=3)
    entry.header.properties.add(key="datahub:op", value="UPDATE")
    lines = assert_exact(entry)
    assert [orjson.loads(line)["payload"]["op"] for line in lines] == ["UPDATE_BEFOR", "UPDATE_AFTER"] * 3


@pytest.mark.parametrize("where", ["header", "row", "last row"])
@pytest.mark.parametrize("dml_type, nrows", [(pb.DELETE, 1), (pb.INSERT, 1), (pb.DELETE, 2), (pb.INSERT, 3)])
def test_a_datahub_op_update_on_a_row_of_one_message_is_an_ordinary_property(where, dml_type, nrows):
    """The fuzz target's find: `datahub:op=UPDATE` in the row properties of a DELETE made
    `BlobEncoder.convert` raise a bare IndexError (facts_hold's reading merged the row's 'two
    halves', of which there was one); on a later row of an INSERT or DELETE it merged the message
    of the row before. Only an update's halves can have come as one message: anywhere else the key
    is the Entry's own, kept exactly, on the C and Python paths alike."""
    entry = dml(dml_type, nrows)
    rows = entry.event.dmlEvent.rows
    target = {"header": entry.header.properties, "row": rows[0].properties, "last row": rows[-1].properties}[where]
    target.add(key="datahub:op", value="UPDATE")
    assert not facts_hold(entry)
    lines = assert_exact(entry)
    op = pb.DMLType.Name(dml_type)
    assert [orjson.loads(line)["payload"]["op"] for line in lines] == [op] * nrows
    assert_same(entry.SerializeToString())


def test_the_fuzz_targets_delete_with_datahub_op_update_round_trips_exactly():
    """The fuzz target's Entry itself (tests/fuzz_seeds/datahub-op-update-on-a-delete-row.pb), built fresh."""
    entry = pb.Entry(header=pb.Header(version=2, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1700000000,
                                      schemaName="db", tableName="t2", seqId=1000))
    event = entry.event.dmlEvent
    event.dmlEventType = pb.DELETE
    event.columns.add(name="c0", originalType="bigint(20)", isKey=True)
    row = event.rows.add()
    row.oldColumns.add(dataType=pb.NA)
    row.properties.add(key="datahub:op", value="UPDATE")
    raw = entry.SerializeToString()
    [msg] = bridge.BlobEncoder().convert(pb.Entry.FromString(raw), raw)
    assert msg["payload"]["op"] == "DELETE" and msg["dts"]["rowProperties"] == [["datahub:op", "UPDATE"]]
    assert_exact(entry)
    assert_same(raw)


@pytest.mark.parametrize("where", ["header", "row", "column", "event"])
@pytest.mark.parametrize("key, value", [("datahub:sequenceId", "77"), ("datahub:foo", "x"),
                                        ("datahub:eventTime", "not a number"), ("datahub:type", "BOOLEAN"),
                                        ("datahub:", ""), ("datahub:before.op", "default")])
def test_reserved_keys_anywhere_in_dts_input_round_trip_exactly(where, key, value):
    entry = dml(pb.UPDATE)
    target = {"header": entry.header.properties, "row": entry.event.dmlEvent.rows[0].properties,
              "column": entry.event.dmlEvent.columns[0].properties, "event": entry.event.properties}[where]
    target.add(key="before", value="1")
    target.add(key=key, value=value)
    target.add(key="after", value="2")
    lines = assert_exact(entry)
    if key == "datahub:sequenceId":  # never the bridge's fact here: the sequenceId is the Entry's
        assert {orjson.loads(line)["payload"]["sequenceId"] for line in lines} == {"9000000"}
    assert_same(entry.SerializeToString())


@pytest.mark.parametrize("key, value", [("datahub:eventTime", "1700000000123"), ("datahub:sequenceId", "abc"),
                                        ("datahub:foo", "1"), ("datahub:schema", "[")])
def test_reserved_keys_on_a_heartbeat_round_trip_exactly(key, value):
    entry = heartbeat()
    entry.header.properties.add(key=key, value=value)
    [line] = assert_exact(entry)
    assert orjson.loads(line)["payload"]["timestamp"]["eventTime"] == 1605339932000


def test_facts_where_the_bridge_writes_them_still_shape_the_message():
    """A foreign message's facts (the bridge's own, where it writes them) keep Blob -> DTS -> Blob."""
    msg = {"schema": {}, "payload": {"op": "MHEARTBEAT", "timestamp": {"eventTime": 1605339932123,
                                                                     "systemTime": 1605339932999}}}
    [entry] = list(bridge.blob_to_entries([msg]))
    assert [p.key for p in entry.header.properties] == [
        "datahub:checkpointTime", "datahub:eventTime", "datahub:sequenceId", "datahub:systemTime", "datahub:version"]
    assert facts_hold(entry)
    assert bridge.entry_to_blob(entry) == [msg]
    assert_exact(entry)


def test_a_bridge_fact_mixed_with_an_ordinary_reserved_key_makes_both_ordinary():
    msg = {"schema": {}, "payload": {"op": "MHEARTBEAT", "sequenceId": "9000000",
                                     "timestamp": {"eventTime": 1605339932123}}, "version": "0.0.1"}
    [entry] = list(bridge.blob_to_entries([msg]))
    entry.header.properties.add(key="datahub:foo", value="bar")
    assert not facts_hold(entry)
    [line] = assert_exact(entry)
    assert orjson.loads(line)["payload"]["timestamp"]["eventTime"] == 1605339932000


def test_strict_mode_writes_no_ordinary_reserved_key_and_applies_no_fact_from_it():
    entry = dml()
    entry.header.properties.add(key="datahub:eventTime", value="1700000000123")
    [msg] = bridge.entry_to_blob(entry, Options(strict=True))
    assert msg["payload"]["timestamp"]["eventTime"] == 1605339932000 and "dts" not in msg


def test_blob_extension_properties_that_read_as_facts_are_a_named_rejection():
    """Blob -> DTS: `dts.header.properties` holding a key that would come back as a fact (it would
    rewrite eventTime on the way back) is no message the bridge writes: rejected, counted."""
    good = bridge.encode_blob(bridge.entry_to_blob(heartbeat())[0])
    bad = orjson.loads(good)
    bad["dts"] = {"header": {"version": 1, "sourceType": 1, "properties": [["datahub:eventTime", "1605339932123"]]}}
    with pytest.raises(ConversionError, match="read as DataHub facts") as info:
        BlobDecoder().feed_line(orjson.dumps(bad), line=2)
    assert info.value.where["line"] == 2
    policy = ErrorPolicy("skip")
    out = list(blob_lines_to_entries([good, orjson.dumps(bad)], policy))
    assert len(out) == 1 and policy.tally.rejected == 1


def test_blob_extension_properties_beside_facts_of_the_message_are_a_named_rejection():
    msg = {"schema": {}, "payload": {"op": "MHEARTBEAT", "sequenceId": "9000000",
                                     "timestamp": {"eventTime": 1605339932123}}, "version": "0.0.1",
           "dts": {"header": {"version": 1, "sourceType": 1, "properties": [["datahub:foo", "1"]]}}}
    with pytest.raises(ConversionError, match="needs DataHub facts besides"):
        BlobDecoder().feed(msg)


def test_blob_row_properties_that_read_as_facts_are_rejected_on_both_paths():
    [line] = bridge.entries_to_blob_lines(pb.Entries(items=[dml()]).SerializeToString())
    msg = orjson.loads(line)
    msg["dts"]["rowProperties"] = [["datahub:eventTime", "1605339932123"]]  # would come back as eventTime
    for native in (True, False):
        decoder = BlobDecoder()
        decoder._native = native
        with pytest.raises(ConversionError, match="read as DataHub facts"):
            decoder.feed_line(orjson.dumps(msg))


@st.composite
def with_reserved_properties(draw, entries=blob_entries()):
    """An Entry with reserved-prefix properties added wherever it has properties."""
    entry = draw(entries)
    targets = [entry.header.properties, entry.event.properties]
    if entry.event.HasField("dmlEvent"):
        targets += [r.properties for r in entry.event.dmlEvent.rows]
        targets += [c.properties for c in entry.event.dmlEvent.columns]
    for target in draw(st.lists(st.sampled_from(targets), min_size=1, max_size=4)):
        name = draw(st.sampled_from(FACT_NAMES))
        value = draw(st.one_of(st.sampled_from(["none", "1", "UPDATE", "BOOLEAN", "default", "[]", "{}",
                                                str(entry.header.timestamp * 1000 + 7)]), st.text(max_size=6)))
        target.add(key="datahub:" + name, value=value)
    return entry


@settings(max_examples=150, deadline=None)
@given(with_reserved_properties())
def test_dts_blob_dts_is_exact_with_reserved_keys_anywhere(entry):
    options = Options()
    try:
        lines, back = round_trip(entry, options)
    except ConversionError:
        with pytest.raises(ConversionError):  # an Entry the bridge rejects anyway (a bad value, an unknown type)
            bridge.entry_to_blob(_without_reserved(entry), options)
        return
    if not lines:
        return  # nothing emitted (a DML event without rows)
    assert [e.SerializeToString() for e in back] == [entry.SerializeToString()]


def _without_reserved(entry: pb.Entry) -> pb.Entry:
    out = pb.Entry()
    out.CopyFrom(entry)
    for props in [out.header.properties] + [r.properties for r in out.event.dmlEvent.rows] + [
            c.properties for c in out.event.dmlEvent.columns]:
        kept = [p for p in props if not p.key.startswith("datahub:")]
        del props[:]
        props.extend(kept)
    return out


@settings(max_examples=60, deadline=None)
@given(with_reserved_properties())
def test_c_and_python_agree_with_reserved_keys_anywhere(entry):
    assert_same(entry.SerializeToString())


# ---- finding 5: an Event without its sub-message ----------------------------------------------

_SUBS = {pb.BEGIN: "beginEvent", pb.COMMIT: "commitEvent", pb.DDL: "ddlEvent", pb.ROLLBACK: "rollbackEvent",
         pb.HEARTBEAT: "heartbeatEvent", pb.CHECKPOINT: "checkpointEvent"}


@pytest.mark.parametrize("mtype", list(_SUBS))
@pytest.mark.parametrize("form", ["no sub-message", "only properties", "no event", "empty sub-message"])
def test_a_non_dml_entry_round_trips_whether_or_not_its_sub_message_is_there(mtype, form):
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=mtype, timestamp=1605339932,
                                      seqId=9))
    if form == "no sub-message":
        entry.event.SetInParent()
    elif form == "only properties":
        entry.event.properties.add(key="k", value="v")
    elif form == "empty sub-message":
        getattr(entry.event, _SUBS[mtype]).SetInParent()
    [line] = assert_exact(entry)
    event = orjson.loads(line).get("dts", {}).get("event", {})
    expected = {"no sub-message": "sub", "only properties": "sub", "no event": "event"}.get(form)
    assert event.get("absent") == expected


def test_a_ddl_entry_without_ddl_event_converts_exactly_as_a_query_without_text():
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DDL, timestamp=1605339932,
                                      seqId=9, schemaName="d", tableName="t"))
    entry.event.SetInParent()
    [line] = assert_exact(entry)
    payload = orjson.loads(line)["payload"]
    assert payload["op"] == "QUERY" and payload["ddl"] == {"text": ""}


@pytest.mark.parametrize("event", [{"absent": "yes"}, {"absent": "event", "properties": [["k", "v"]]},
                                   {"absent": "sub", "epoch": 5}, {"absent": True}])
def test_an_absent_marker_that_contradicts_the_message_is_a_format_error(event):
    msg = bridge.entry_to_blob(heartbeat())[0]
    msg["dts"] = {"header": {"version": 1, "sourceType": 1}, "event": event}
    with pytest.raises(BlobFormatError, match="absent"):
        BlobDecoder().feed(msg)


def test_an_absent_ddl_event_with_a_statement_is_a_format_error():
    msg = {"schema": {"source": {"dbType": "MySQL", "dbName": "d", "schemaName": "d", "tableName": "t"}},
           "payload": {"op": "QUERY", "sequenceId": "9000000", "timestamp": {"eventTime": 1605339932000,
                                                                             "checkpointTime": 1605339932000},
                       "ddl": {"text": "GRANT ALL"}}, "version": "0.0.1",
           "dts": {"header": {"version": 1}, "event": {"absent": "sub"}}}
    with pytest.raises(BlobFormatError, match="no statement"):
        BlobDecoder().feed(msg)


# ---- finding 4: one Blob line's size and shape, before it is parsed ----------------------------

def test_the_default_line_bound_is_16_mib_in_options_and_framing():
    assert DEFAULT_OPTIONS.max_line_bytes == DEFAULT_MAX_LINE_BYTES == 16 << 20


def test_feed_line_refuses_a_line_over_max_line_bytes_naming_it():
    line = bridge.encode_blob(bridge.entry_to_blob(heartbeat())[0])
    decoder = BlobDecoder(Options(max_line_bytes=len(line)))
    assert decoder.feed_line(line + b"\n", line=1)  # exactly the bound (its line break aside)
    with pytest.raises(LineTooLongError, match="max_line_bytes") as info:
        decoder.feed_line(line + b" ", line=2, source="in.jsonl")
    assert info.value.where["line"] == 2 and info.value.length == len(line) + 1 and info.value.head == line + b" "


@pytest.mark.parametrize("text", [b"[{},{}]", b' \t[{}]', b'"MHEARTBEAT"', b"123", b"null", b"true"])
def test_a_json_text_that_is_no_object_is_refused_before_it_is_parsed(text, monkeypatch):
    import bridge.blob.decode as decode

    def no_parse(_):
        raise AssertionError("parsed")
    monkeypatch.setattr(decode.orjson, "loads", no_parse)
    with pytest.raises(BlobFormatError, match="JSON object"):
        BlobDecoder().feed_line(text, line=1)
    with pytest.raises(BlobFormatError, match="JSON object"):
        bridge.decode_blob(text)


def test_a_line_after_whitespace_still_decodes():
    line = bridge.encode_blob(bridge.entry_to_blob(heartbeat())[0])
    assert BlobDecoder().feed_line(b" \t" + line)


def test_a_max_size_array_line_costs_no_more_than_the_line():
    """The issue's line (`[{},{},...]` just under the bound) reached 2 GB before it was rejected."""
    line = b"[" + b"{}," * ((4 << 20) // 3) + b"{}]"
    decoder = BlobDecoder(Options(max_line_bytes=len(line)))
    tracemalloc.start()
    try:
        with pytest.raises(BlobFormatError):
            decoder.feed_line(line, line=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(line) // 4
    with pytest.raises(LineTooLongError):  # and one byte over the bound is refused by size first
        BlobDecoder(Options(max_line_bytes=len(line) - 1)).feed_line(line)


# ---- the accounting law when an Entry's last message is rejected ----------------------------------

def _lines_with_bad(entry: pb.Entry, bad: int) -> list[bytes]:
    """The Entry's Blob lines, line `bad` given row properties that would read as facts (rejected
    when its Entry completes, by `_check_plain`)."""
    lines = bridge.entries_to_blob_lines(pb.Entries(items=[entry]).SerializeToString())
    msg = orjson.loads(lines[bad])
    msg["dts"]["rowProperties"] = [["datahub:eventTime", "1605339932123"]]
    lines[bad] = orjson.dumps(msg)
    return lines


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("dml_type, nrows, bad", [(pb.INSERT, 3, 2), (pb.INSERT, 3, 0), (pb.UPDATE, 1, 1),
                                                  (pb.UPDATE, 2, 3), (pb.UPDATE, 2, 0), (pb.DELETE, 4, 1)])
def test_an_entry_rejected_on_its_last_message_rejects_every_message_of_it(native, dml_type, nrows, bad):
    """A multi-row event (or an update pair) whose last message is rejected when it completes the
    Entry: the messages held before it gave no Entry either, so they count as rejected, not
    converted (they counted as converted before: converted + rejected == input held, but wrongly)."""
    lines = _lines_with_bad(dml(dml_type, nrows), bad)
    good = bridge.entries_to_blob_lines(pb.Entries(items=[heartbeat()]).SerializeToString())
    policy = ErrorPolicy("skip")
    decoder = BlobDecoder()
    decoder._native = native
    stream = decoder_entries(
        ((({"line": n}), line, None) for n, line in enumerate(lines + good, 1)), decoder, policy,
        lambda line, where: decoder.feed_line(line, line=where["line"]))
    out = [entry for _, entry, _ in stream]
    tally = policy.tally
    assert len(out) == 1 and out[0].header.messageType == pb.HEARTBEAT
    assert (tally.input, tally.converted, tally.rejected, tally.not_emitted) == (len(lines) + 1, 1, len(lines), 0)
    assert tally.balanced()
    assert any("earlier message" in r["reason"] for r in policy.rejects)


def test_blob_lines_to_entries_counts_the_held_rows_of_a_rejected_event():
    lines = _lines_with_bad(dml(pb.INSERT, 3), 2)
    policy = ErrorPolicy("skip")
    assert list(blob_lines_to_entries(lines, policy)) == []
    assert (policy.tally.input, policy.tally.converted, policy.tally.rejected) == (3, 0, 3)
