"""Writes the seed inputs of this folder (hostile inputs: docs/decisions.md, "The C fast path"); see README.md.

    .venv/bin/python tests/fuzz_seeds/make_seeds.py

Deterministic: running it again gives the same bytes.
"""
from __future__ import annotations

import gzip
import pathlib
import sys

import orjson

import bridge
from bridge import pb

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from support.wire_spec import varint  # noqa: E402  (the tests' one varint writer)

T0 = 1_700_000_000


def _header(seq_id: int, **fields) -> pb.Header:
    fields = {"schemaName": "shop", "tableName": "orders", "messageType": pb.DML, **fields}
    return pb.Header(version=1, sourceType=pb.MYSQL, timestamp=T0, seqId=seq_id, **fields)


def _dml(seq_id: int, dml_type: int = pb.INSERT, rows: int = 2, **fields) -> pb.Entry:
    entry = pb.Entry(header=_header(seq_id, **fields))
    dml = entry.event.dmlEvent
    dml.dmlEventType = dml_type
    dml.columns.add(name="id", originalType="bigint(20)", isKey=True)
    dml.columns.add(name="name", originalType="varchar(32)")
    for i in range(rows):
        row = dml.rows.add()
        images = {pb.INSERT: (row.newColumns,), pb.DELETE: (row.oldColumns,),
                  pb.UPDATE: (row.oldColumns, row.newColumns)}[dml_type]
        for image in images:
            image.add(dataType=pb.INT64, sv=str(seq_id * 10 + i))
            image.add(dataType=pb.STRING, charset="utf8mb4", bv=f"n{i}".encode())
    return entry


def _write_pb(name: str, entries: list, per_envelope: bool = True) -> None:
    groups = [[e] for e in entries] if per_envelope else [entries]
    with open(HERE / name, "wb") as fh:
        bridge.write_pb(fh, [env for group in groups for env in bridge.pack_entries(group)])


def _blob(name: str, messages: list) -> None:
    (HERE / name).write_bytes(b"".join(orjson.dumps(m) + b"\n" for m in messages))


def _repeated_name_message(op: str) -> dict:
    image = {"dataColumn": {"k": 1, "hidden": 42}}
    payload = {"before" if op in ("UPDATE_BEFOR", "DELETE") else "after": image, "op": op,
               "sequenceId": "5000000", "timestamp": {"eventTime": T0 * 1000, "checkpointTime": T0 * 1000}}
    return {"schema": {"dataColumn": [{"name": "k", "type": "LONG"}, {"name": "k", "type": "LONG"}],
                       "primaryKey": [], "source": {"dbType": "MySQL", "dbName": "d", "schemaName": "d",
                                                    "tableName": "t"}},
            "payload": payload, "version": "0.0.1"}


def _wrong_image(seq_id: int, dml_type: int) -> pb.Entry:
    entry = _dml(seq_id, dml_type)
    row = entry.event.dmlEvent.rows[1]
    (row.oldColumns if dml_type == pb.INSERT else row.newColumns).extend(
        row.newColumns if dml_type == pb.INSERT else row.oldColumns)
    return entry


def main() -> None:
    # 1. Blob -> DTS: a repeated column name and a key no column has
    _blob("repeated-column-insert.blob.jsonl", [_repeated_name_message("INSERT")])
    _blob("repeated-column-update-half.blob.jsonl", [_repeated_name_message("UPDATE_BEFOR")])
    # 2. one bad Entry between two good ones, one Envelope each (Spark's skip modes)
    for name, change in (("unknown-source-type", lambda e: setattr(e.header, "sourceType", 4)),
                         ("unknown-column-type", lambda e: setattr(e.event.dmlEvent.columns[1], "originalType",
                                                                   "frobnicate(3)")),
                         ("unparsable-column-type", lambda e: setattr(e.event.dmlEvent.columns[1], "originalType",
                                                                      "varchar(x)"))):
        middle = _dml(2)
        change(middle)
        _write_pb(f"{name}-middle.pb", [_dml(1), middle, _dml(3)])
    # 3. an image the op must not carry, with a second defect
    defects = {"bad-timestamp": lambda e: setattr(e.header, "timestamp", 5),
               "unknown-source-type": lambda e: setattr(e.header, "sourceType", 9),
               "unknown-column-type": lambda e: setattr(e.event.dmlEvent.columns[1], "originalType", "frobnicate(3)")}
    for op, dml_type in (("insert-with-before", pb.INSERT), ("delete-with-after", pb.DELETE)):
        entries = []
        for seq_id, change in enumerate(defects.values(), 10):
            entry = _wrong_image(seq_id, dml_type)
            change(entry)
            entries.append(entry)
        _write_pb(f"{op}-and-a-second-defect.pb", entries)
    # 4. amplification: 2,000 int columns, 20,000 empty rows; a 100 MB line of Blob input
    wide = pb.Entry(header=_header(1, tableName="wide"))
    dml = wide.event.dmlEvent
    for i in range(2000):
        dml.columns.add(name=f"c{i}", originalType="int(11)")
    for _ in range(20_000):
        dml.rows.add()
    _write_pb("wide-empty-rows.pb", [wide])
    with gzip.GzipFile(HERE / "long-line.blob.jsonl.gz", "wb", mtime=0) as fh:
        fh.write(b"[" + b"0," * (50 * 1000 * 1000 - 1) + b"0]\n")
    # 5. the sink on Entries with seqId 0
    entries = []
    for dml_type in (pb.INSERT, pb.UPDATE, pb.DELETE):
        entry = _dml(0, dml_type)
        entry.header.seqId = 0
        entries.append(entry)
    _write_pb("seq-id-0.pb", entries, per_envelope=False)
    # 6. unknown fields in every kind of message of a DML Entry and of a BEGIN
    entry = _dml(7, pb.UPDATE)
    entry.MergeFromString(b"\x30\x05")
    entry.header.MergeFromString(b"\x80\x01\x07")
    entry.event.MergeFromString(b"\x45\x01\x02\x03\x04")
    entry.event.dmlEvent.MergeFromString(b"\x22\x01x")
    entry.event.dmlEvent.columns[1].MergeFromString(b"\xab\x02\x08\x01\xac\x02")  # a group
    entry.event.dmlEvent.rows[0].MergeFromString(b"\x28\x02")
    entry.event.dmlEvent.rows[0].oldColumns[0].MergeFromString(b"\x28\x03")
    entry.event.dmlEvent.rows[1].newColumns[1].MergeFromString(b"\x0d\x00\x00\x80\x3f")
    begin = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.BEGIN, timestamp=T0, seqId=6))
    begin.event.beginEvent.transactionId = "t1"
    begin.event.beginEvent.MergeFromString(b"\x18\x96\x81\x80\x00")  # an overlong varint, kept as it came
    _write_pb("unknown-fields.pb", [begin, entry], per_envelope=False)
    issue_29()


def issue_29() -> None:
    """The input classes of issue 29 (the `.pb` seeds: one Envelope each Entry; `.entries.bin`: an
    Entries' bytes as they are, the fuzz target's b"N" inputs)."""
    # 1. keys of the reserved prefix on DTS input: header, event, column and row properties
    props = [("datahub:eventTime", "1700000000123"), ("datahub:op", "INSERT"), ("datahub:sequenceId", "42"),
             ("datahub:foo", "bar")]
    entries = []
    for seq_id, (dml_type, (key, value)) in enumerate(zip((pb.DELETE, pb.DELETE, pb.INSERT, pb.UPDATE), props), 20):
        entry = _dml(seq_id, dml_type, rows=1)
        entry.header.properties.add(key=key, value=value)
        entries.append(entry)
    update = _dml(24, pb.UPDATE, rows=1)
    update.header.properties.add(key="datahub:op", value="UPDATE")
    update.event.properties.add(key="datahub:op", value="DELETE")
    update.event.dmlEvent.columns[1].properties.add(key="datahub:eventTime", value="1")
    update.event.dmlEvent.rows[0].properties.add(key="datahub:sequenceId", value="7")
    entries.append(update)
    _write_pb("reserved-prefix-properties.pb", entries)
    # ... and `datahub:op=UPDATE` on a row that gives one message (the fuzz target's find: facts_hold's
    # reading merged two 'halves' and raised a bare IndexError): the found Entry as it was, then the
    # key on the last of three INSERT rows and on a DELETE's header
    found = pb.Entry(header=pb.Header(version=2, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=T0,
                                      schemaName="db", tableName="t2", seqId=1000))
    found.event.dmlEvent.dmlEventType = pb.DELETE
    found.event.dmlEvent.columns.add(name="c0", originalType="bigint(20)", isKey=True)
    row = found.event.dmlEvent.rows.add()
    row.oldColumns.add(dataType=pb.NA)
    row.properties.add(key="datahub:op", value="UPDATE")
    inserts = _dml(25, pb.INSERT, rows=3)
    inserts.event.dmlEvent.rows[2].properties.add(key="datahub:op", value="UPDATE")
    delete = _dml(26, pb.DELETE, rows=1)
    delete.header.properties.add(key="datahub:op", value="UPDATE")
    _write_pb("datahub-op-update-on-one-message-rows.pb", [found, inserts, delete])
    # 2. non-DML Entries whose Event lacks the sub-message its messageType names, holds only
    # properties, or (DDL) has no SQL
    entries = []
    for seq_id, mt in enumerate((pb.HEARTBEAT, pb.BEGIN, pb.COMMIT, pb.CHECKPOINT, pb.ROLLBACK, pb.DDL), 30):
        bare = pb.Entry(header=_header(seq_id, messageType=mt))
        only_props = pb.Entry(header=_header(seq_id + 10, messageType=mt))
        only_props.event.properties.add(key="k", value="v")
        entries += [bare, only_props]
    ddl = pb.Entry(header=_header(50, messageType=pb.DDL))
    ddl.event.ddlEvent.schemaName = "shop"  # a DDLEvent without SQL
    entries.append(ddl)
    _write_pb("non-dml-without-sub-message.pb", entries)
    # 3. Entries bytes with tags and lengths at the edges of what protobuf reads
    item = pb.Entry(header=_header(60, messageType=pb.HEARTBEAT),
                    event=pb.Event(heartbeatEvent=pb.HeartbeatEvent(epoch=T0))).SerializeToString()
    framed = b"\x0a" + varint(len(item)) + item
    cases = {
        "tag-above-2-32-on-field-2": varint(1 << 35 | 2 << 3 | 2) + varint(len(item)) + item,  # C dropped it
        "tag-above-2-32-on-field-1": varint(1 << 32 | 1 << 3 | 2) + varint(len(item)) + item,
        "overlong-6-byte-tag": varint(1 << 3 | 2, 6) + varint(len(item)) + item,
        "overlong-5-byte-tag-and-length": varint(1 << 3 | 2, 5) + varint(len(item), 5) + item,  # protobuf takes it
        "overlong-6-byte-length": b"\x0a" + varint(len(item), 6) + item,
        "field-2-29": framed + varint(1 << 29 << 3) + b"\x00",
        "field-0": framed + b"\x00\x00",
        "wire-types-6-and-7": framed + b"\x16\x00\x17\x00",
        "group-skipped-by-protobuf": framed + b"\x13\x08\x01\x14" + framed,
    }
    for name, data in cases.items():
        (HERE / f"{name}.entries.bin").write_bytes(data)
    # 4. one-character latin-1 values (CPython's shared one-character strs) and a two-character one
    entry = _dml(70, rows=0)
    for i, value in enumerate((b"\xe9", b"\xa0", b"\xff", b"\x80", b"\xe9\xe8")):
        row = entry.event.dmlEvent.rows.add()
        row.newColumns.add(dataType=pb.INT64, sv=str(i))
        row.newColumns.add(dataType=pb.STRING, charset="latin1", bv=value)
    _write_pb("one-character-latin1.pb", [entry])


if __name__ == "__main__":
    main()
