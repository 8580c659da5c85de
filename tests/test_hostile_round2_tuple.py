"""Issue 29, finding 1 on the Tuple side: reserved-prefix (`datahub:`) properties in DTS input
(docs/tuple.md, "DataHub facts").

DTS -> Tuple read every `datahub:` key of the header and of a row as a fact: `datahub:eventTime`
in a DELETE's header rewrote `_execute_time_`, `datahub:sequenceId` the `_sequence_id_`, and any
other such key vanished. Now a key is a fact only where and as the bridge writes it (a row
change's `sequenceId`, `eventTime`, `sourceTable`, exactly as TupleDecoder writes them for the
header they stand beside), so DTS -> Tuple -> DTS gives it back; any other reserved key of a DML
Entry is its own property, which a Tuple row cannot carry: a ConversionError naming the keys,
counted as a rejection, on the C path and the Python path alike.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bridge
from bridge import ConversionError, Options, pb
from bridge.stream import ErrorPolicy, entries_to_outputs
from bridge.tuple import TupleEncoder, record_schema, tuples_to_entries

SEQ, TS = 7, 1605339932


def dml(dml_type=pb.DELETE, nrows: int = 1, seq: int = SEQ, ts: int = TS) -> pb.Entry:
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=ts,
                                      seqId=seq, schemaName="shop", tableName="orders"))
    event = entry.event.dmlEvent
    event.dmlEventType = dml_type
    event.columns.add(name="id", originalType="bigint(20)", isKey=True)
    event.columns.add(name="name", originalType="varchar(8)")
    for i in range(nrows):
        row = event.rows.add()
        image = [pb.Data(dataType=pb.INT64, sv=str(i)), pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=b"x")]
        if dml_type != pb.INSERT:
            row.oldColumns.extend(image)
        if dml_type != pb.DELETE:
            row.newColumns.extend(image)
    return entry


def outcome(entry: pb.Entry, options: Options = bridge.DEFAULT_OPTIONS, native: bool = True, stream=False):
    raw = entry.SerializeToString()
    encoder = TupleEncoder(options, native=native)
    try:
        rows = (encoder.stream if stream else encoder.convert)(pb.Entry.FromString(raw), raw if native else None)
        return list(rows), (encoder.entries, encoder.emitted)
    except ConversionError as exc:
        return ("error", str(exc)), (encoder.entries, encoder.emitted)


def both_paths(entry: pb.Entry, options: Options = bridge.DEFAULT_OPTIONS):
    """The C path (the Entry's bytes) and the Python path give the same rows or error, and counts."""
    got = outcome(entry, options)
    assert outcome(entry, options, native=False) == got
    return got[0]


def rejected(entry: pb.Entry, match: str, options: Options = bridge.DEFAULT_OPTIONS) -> str:
    out = both_paths(entry, options)
    assert isinstance(out, tuple) and out[0] == "error", out
    assert "reserved-prefix keys that are not the bridge's DataHub facts" in out[1] and match in out[1], out[1]
    return out[1]


def back(entry: pb.Entry, options: Options = bridge.DEFAULT_OPTIONS) -> list[pb.Entry]:
    """DTS -> Tuple -> DTS, read back with the Entry's own columns."""
    columns = list(entry.event.dmlEvent.columns)
    rows = bridge.entry_to_tuples(entry, options)
    return list(tuples_to_entries(rows, record_schema(columns, options), options, table=("shop", "orders"),
                                  columns=columns))


def reserved(props) -> list[tuple[str, str]]:
    return [(p.key, p.value) for p in props if p.key.startswith("datahub:")]


# ---- the cases -------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [("datahub:eventTime", "1700000000123"), ("datahub:sequenceId", "42"),
                                        ("datahub:sourceTable", "a.b"), ("datahub:foo", "x"),
                                        ("datahub:eventTime", "1605339932123")])
def test_a_datahub_key_in_a_dml_header_is_a_named_rejection_not_a_rewrite(key, value):
    """The issue's case (`datahub:eventTime` on a DELETE's header became `_execute_time_`): the
    bridge writes no fact in a DML Entry's header, so the key is the Entry's own."""
    entry = dml()
    entry.header.properties.add(key="plain", value="1")
    entry.header.properties.add(key=key, value=value)
    rejected(entry, "the bridge writes none in a DML Entry's header")


def test_a_datahub_key_in_the_event_properties_is_a_named_rejection():
    entry = dml(pb.UPDATE)
    entry.event.properties.add(key="datahub:op", value="INSERT")
    rejected(entry, "the bridge writes none in an Event")


@pytest.mark.parametrize("pairs, why", [
    ([("datahub:foo", "x")], "not a Tuple fact: datahub:foo"),
    ([("datahub:op", "UPDATE")], "not a Tuple fact: datahub:op"),
    ([("datahub:systemTime", "1605339932999")], "not a Tuple fact: datahub:systemTime"),
    ([("datahub:eventTime", "1700000000123")], "is not a millisecond of timestamp"),
    ([("datahub:eventTime", "1605339932000")], "is not a millisecond of timestamp"),  # whole seconds: never written
    ([("datahub:eventTime", "abc")], "is not a millisecond of timestamp"),
    ([("datahub:sequenceId", "42")], "is not what the bridge writes for seqId 7"),
    ([("datahub:sequenceId", "7000000")], "is not what the bridge writes for seqId 7"),  # the default: never written
    ([("datahub:sequenceId", "x7000001")], "is not what the bridge writes for seqId 7"),
    ([("datahub:sequenceId", "7000003"), ("datahub:eventTime", "1605339932123")], "not in the order"),
    ([("datahub:eventTime", "1605339932123"), ("datahub:eventTime", "1605339932124")], "repeated"),
    ([("datahub:sourceTable", "shop.orders")], "is not the header's table"),
    ([("datahub:sourceTable", "other.orders")], "is not the header's table"),
])
@pytest.mark.parametrize("dml_type", [pb.INSERT, pb.UPDATE, pb.DELETE])
def test_row_keys_that_are_not_facts_as_the_bridge_writes_them_are_a_named_rejection(pairs, why, dml_type):
    entry = dml(dml_type)
    for key, value in pairs:
        entry.event.dmlEvent.rows[0].properties.add(key=key, value=value)
    rejected(entry, why, Options(source_table=True))


def test_a_source_table_fact_without_the_source_table_column_is_a_named_rejection():
    entry = dml(pb.INSERT)
    entry.header.tableName = ""
    entry.event.dmlEvent.rows[0].properties.add(key="datahub:sourceTable", value="shop")
    rejected(entry, "without Options.source_table's column")
    [row] = both_paths(entry, Options(source_table=True))
    assert row["_source_table_"] == "shop"


def test_rejections_are_counted_and_the_stream_goes_on():
    bad = dml()
    bad.header.properties.add(key="datahub:eventTime", value="1700000000123")
    policy = ErrorPolicy("skip")
    encoder = TupleEncoder()
    out = list(entries_to_outputs([({"entry": 0}, dml()), ({"entry": 1}, bad), ({"entry": 2}, dml(pb.INSERT))],
                                  encoder.convert, policy))
    assert [where["entry"] for where, _ in out] == [0, 2]
    assert (policy.tally.converted, policy.tally.rejected) == (2, 1)
    reject = policy.rejects[0]
    assert "DML Entry's header" in reject["reason"] and "datahub:eventTime" in str(reject), reject


def test_a_large_entry_is_rejected_before_a_row_is_given():
    entry = dml(pb.INSERT, nrows=40)
    entry.header.properties.add(key="datahub:sequenceId", value="1")
    encoder = TupleEncoder(cell_budget=16)
    with pytest.raises(ConversionError, match="DML Entry's header"):
        encoder.stream(entry, entry.SerializeToString())
    entry = dml(pb.INSERT, nrows=40)
    entry.event.dmlEvent.rows[39].properties.add(key="datahub:foo", value="1")
    for native in (True, False):
        with pytest.raises(ConversionError, match="datahub:foo"):
            TupleEncoder(cell_budget=16, native=native).stream(entry, entry.SerializeToString() if native else None)


def test_a_non_dml_entry_with_datahub_keys_is_not_emitted_as_before():
    entry = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.HEARTBEAT, timestamp=TS, seqId=9))
    entry.header.properties.add(key="datahub:eventTime", value="1605339932123")
    entry.event.heartbeatEvent.SetInParent()
    encoder = TupleEncoder()
    assert encoder.convert(entry) == [] and encoder.not_emitted == {"HEARTBEAT": 1}


# ---- facts where and as the bridge writes them ----------------------------------------------------

def test_facts_as_tuple_decoder_writes_them_give_the_meta_columns_and_come_back():
    schema = record_schema(list(dml().event.dmlEvent.columns), Options(source_table=True))
    rows = [{"id": 1, "name": "x", "_sequence_id_": "7000003", "_operation_type_": "I", "_execute_time_": TS * 1000 + 123,
             "_before_image_": "N", "_after_image_": "Y", "_source_table_": "plain"}]
    options = Options(source_table=True)
    [entry] = tuples_to_entries(rows, schema, options)
    assert reserved(entry.event.dmlEvent.rows[0].properties) == [
        ("datahub:eventTime", "1605339932123"), ("datahub:sequenceId", "7000003"), ("datahub:sourceTable", "plain")]
    assert both_paths(entry, options) == rows


def test_a_foreign_blob_messages_row_facts_are_tuple_facts():
    """Blob -> DTS writes a foreign message's sequenceId and millisecond eventTime as the same row facts."""
    msg = {"schema": {"dataColumn": [{"name": "id", "type": "LONG"}], "primaryKey": ["id"],
                      "source": {"dbType": "MySQL", "dbName": "d", "schemaName": "d", "tableName": "t"}},
           "payload": {"after": {"dataColumn": {"id": 1}}, "op": "INSERT", "sequenceId": "123",
                       "timestamp": {"eventTime": 1605339932123, "checkpointTime": 1605339932123}},
           "version": "0.0.1"}
    [entry] = bridge.blob_to_entries([msg])
    [row] = both_paths(entry)
    assert (row["_sequence_id_"], row["_execute_time_"]) == ("123", 1605339932123)


@pytest.mark.parametrize("dml_type", [pb.INSERT, pb.UPDATE, pb.DELETE])
def test_dts_tuple_dts_keeps_the_facts_of_each_row(dml_type):
    """A row i > 0 of an event comes back as an Entry of its own with its sequenceId as a fact."""
    entry = dml(dml_type, nrows=3)
    entry.event.dmlEvent.rows[1].properties.add(key="datahub:eventTime", value="1605339932999")
    entry.event.dmlEvent.rows[2].properties.add(key="datahub:sequenceId", value="7999999")
    entries = back(entry)
    assert [reserved(e.event.dmlEvent.rows[0].properties) for e in entries] == [
        [], [("datahub:eventTime", "1605339932999"), ("datahub:sequenceId", "7000001")],
        [("datahub:sequenceId", "7999999")]]
    assert [e.header.timestamp for e in entries] == [TS] * 3
    assert [r for e in entries for r in bridge.entry_to_tuples(e)] == bridge.entry_to_tuples(entry)


_KEYS = ["datahub:eventTime", "datahub:sequenceId", "datahub:sourceTable", "datahub:foo", "datahub:", "datahub:op"]
_VALUES = ["1605339932123", "1605339932000", "7000001", "7000000", "7999999", "42", "shop.orders", "shop", "",
           "UPDATE"]


@settings(max_examples=200, deadline=None)
@given(dml_type=st.sampled_from([pb.INSERT, pb.UPDATE, pb.DELETE]), nrows=st.integers(1, 3),
       placed=st.lists(st.tuples(st.sampled_from(["header", "event", "row 0", "row 1", "row 2"]),
                                 st.sampled_from(_KEYS), st.sampled_from(_VALUES)), min_size=1, max_size=4),
       source_table=st.booleans())
def test_reserved_keys_anywhere_come_back_or_the_entry_is_rejected(dml_type, nrows, placed, source_table):
    """Never a silent rewrite: rows are given only when every reserved key of the Entry comes back
    from them (DTS -> Tuple -> DTS) where it was; else a ConversionError on both paths."""
    options = Options(source_table=source_table)
    entry = dml(dml_type, nrows)
    rows = entry.event.dmlEvent.rows
    for where, key, value in placed:
        target = {"header": entry.header.properties, "event": entry.event.properties}.get(where)
        if target is None:
            index = int(where[-1])
            if index >= nrows:
                continue
            target = rows[index].properties
        target.add(key=key, value=value)
    out = both_paths(entry, options)
    if isinstance(out, tuple):
        return
    assert not reserved(entry.header.properties) and not reserved(entry.event.properties)
    entries = back(entry, options)
    assert len(entries) == nrows
    for index, (row, again) in enumerate(zip(rows, entries)):
        kept = reserved(again.event.dmlEvent.rows[0].properties)
        if index:  # the default sequenceId of a later row becomes a fact of its own Entry
            kept = [kv for kv in kept if kv != ("datahub:sequenceId", str(SEQ * 10 ** 6 + index))]
        assert kept == reserved(row.properties)
