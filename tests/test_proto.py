"""The wire contract (tests/support/wire_spec.py's transcription), checked against the committed proto and generated module,
against an independent encoder compiled from that transcription, and against the shared strategies."""
import io
import json
import math
import re
import struct
from datetime import date, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from google.protobuf import descriptor_pb2, json_format
from hypothesis import given
from hypothesis import strategies as st

from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import Assembled, Reassembler, pack_entries, read_pb, write_pb
from support.strategies import MYSQL_CHARSETS, RESERVED_PREFIX, ddl_statements, entries, entry_streams, parse_mysql_type
from support.wire_spec import SPEC_ENUMS, SPEC_MESSAGES, compile_spec, protoc, varint

ROOT = Path(__file__).resolve().parent.parent

@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> SimpleNamespace:
    """Message classes compiled from the transcription alone, in their own descriptor pool."""
    return compile_spec(tmp_path_factory.mktemp("spec_check"))


# ---- (a) the committed generated module is current -----------------------------------------

def test_generated_module_matches_the_committed_proto(tmp_path):
    protoc("-Iproto", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", "proto/subscribe.proto")
    for name in ("subscribe_pb2.py", "subscribe_pb2.pyi"):
        assert (tmp_path / name).read_bytes() == (ROOT / "bridge" / "wire" / name).read_bytes(), \
            f"bridge/wire/{name} is stale: run `make proto`"


# ---- (c) enums and messages are exactly the transcription's --------------------------------------

@pytest.mark.parametrize("name", sorted(SPEC_ENUMS))
def test_enum_members_are_the_specs(name):
    enum = pb.DESCRIPTOR.enum_types_by_name[name]
    assert {v.name: v.number for v in enum.values} == SPEC_ENUMS[name]


def test_no_enums_or_messages_beyond_the_spec():
    assert set(pb.DESCRIPTOR.enum_types_by_name) == set(SPEC_ENUMS)
    assert set(pb.DESCRIPTOR.message_types_by_name) == set(SPEC_MESSAGES)
    file = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(file)
    assert file.package == "subscribe" and file.syntax == "proto3"


def shape(descriptor) -> list[tuple]:
    proto = descriptor_pb2.DescriptorProto()
    descriptor.CopyToProto(proto)
    return sorted((f.number, f.name, f.type, f.label, f.type_name.rpartition(".")[2], f.HasField("oneof_index"))
                  for f in proto.field)


@pytest.mark.parametrize("name", sorted(SPEC_MESSAGES))
def test_message_fields_are_the_specs(spec, name):
    assert shape(pb.DESCRIPTOR.message_types_by_name[name]) == shape(getattr(spec, name).DESCRIPTOR)


# ---- (b) an independent encoder and decoder (support.wire_spec.varint) ----------------------

def read_varints(data: bytes) -> list[bytes]:
    """Split a delimited stream by hand."""
    out, pos = [], 0
    while pos < len(data):
        length = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        out.append(data[pos:pos + length])
        pos += length
    return out


def spec_frame(spec, groups: list[list], segment: int) -> bytes:
    """Entries per group, cut into `segment`-byte Envelopes, written as a delimited stream."""
    out = bytearray()
    for group in groups:
        data = spec.Entries(items=group).SerializeToString()
        cuts = [data[i:i + segment] for i in range(0, len(data), segment)] or [b""]
        for index, cut in enumerate(cuts):
            raw = spec.Envelope(version=1, total=len(cuts), index=index, data=cut).SerializeToString()
            out += varint(len(raw)) + raw
    return bytes(out)


def spec_unframe(spec, data: bytes) -> list:
    items, buffer = [], b""
    for raw in read_varints(data):
        env = spec.Envelope.FromString(raw)
        assert env.version == 1 and env.index < env.total
        buffer += env.data
        if env.index == env.total - 1:
            items.extend(spec.Entries.FromString(buffer).items)
            buffer = b""
    assert buffer == b""
    return items


def project_read(data: bytes) -> list[pb.Entry]:
    r = Reassembler()
    results = [out for number, _, raw in read_pb(io.BytesIO(data)) for out in r.feed(0, number, raw)]
    assert all(isinstance(out, Assembled) for out in results), results
    assert r.finish() == []
    return [e for out in results for e in out.entries.items]


def as_dict(message) -> dict:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def rich_entries(spec) -> list:
    """Every event kind, DML of each type with values of every DataType, built from the transcription's classes."""
    def header(message_type, seq_id):
        return dict(version=1, sourceType="MYSQL", messageType=message_type, timestamp=2**32 - 1,
                    serverId=-(2**63), fileName="mysql-bin.000042", position=2**64 - 1,
                    gtid="3e11fa47-71ca-11e1-9e33-c80aa9429562:23", schemaName="shop", tableName="订单",
                    seqId=seq_id, eventIndex=seq_id, isLast=seq_id % 2 == 0,
                    properties=[dict(key="k", value="v"), dict(key="", value="é")])

    columns = [dict(name="id", originalType="bigint(20) unsigned", isKey=True),
               dict(name="name", originalType="varchar(32)", properties=[dict(key="c", value="1")]),
               dict(name="price", originalType="decimal(10,2)"),
               dict(name="note", originalType="text"),
               dict(name="at", originalType="timestamp(3)"),
               dict(name="doc", originalType="json"),
               dict(name="ratio", originalType="float"),
               dict(name="t", originalType="time"),
               dict(name="tiny", originalType="tinyint(4)"),
               dict(name="raw", originalType="varbinary(8)")]
    image = [dict(dataType="UINT64", sv="18446744073709551615"),
             dict(dataType="STRING", charset="utf8mb4", bv="Zoë 🚀".encode()),
             dict(dataType="DECIMAL", sv="-12.50"),
             dict(dataType="STRING", charset="gbk", bv="中文".encode("gbk")),
             dict(dataType="STRING", bv=b"2021-05-17 07:22:42.123 +08:00"),
             dict(dataType="BYTES", bv=b'{"a": [1, 2.5, null]}'),
             dict(dataType="FLOAT32", sv="0.10000000149011612"),
             dict(dataType="STRING", bv=b"-838:59:59"),
             dict(dataType="INT8", sv="-128"),
             dict(dataType="STRING", charset="binary", bv=b"\x00\xff")]
    other = [dict(dataType="UINT64", sv="1"), dict(dataType="NIL"), dict(dataType="NA"), dict(dataType="NIL"),
             dict(dataType="STRING", bv=b"0000-00-00 00:00:00.000 +00:00"), dict(dataType="NA"),
             dict(dataType="FLOAT32", sv="-0.0"), dict(dataType="STRING", bv=b"00:00:00"),
             dict(dataType="INT8", sv="127"), dict(dataType="STRING", charset="binary", bv=b"")]

    def dml(seq_id, kind, rows):
        return spec.Entry(header=header("DML", seq_id), event=dict(
            dmlEvent=dict(dmlEventType=kind, columns=columns, rows=rows), properties=[dict(key="e", value="1")]))

    def entry(message_type, seq_id, **event):
        return spec.Entry(header=header(message_type, seq_id), event=event)

    return [
        entry("BEGIN", 1, beginEvent=dict(transactionId="tx-1", threadId=-9)),
        dml(2, "INSERT", [dict(newColumns=image), dict(newColumns=other, properties=[dict(key="r", value="2")])]),
        dml(3, "UPDATE", [dict(oldColumns=image, newColumns=other)]),
        dml(4, "DELETE", [dict(oldColumns=other)]),
        entry("COMMIT", 5, commitEvent=dict(transactionId="tx-1")),
        entry("DDL", 6, ddlEvent=dict(schemaName="shop", sql="ALTER TABLE `订单` ADD c INT", executionTime=3)),
        entry("ROLLBACK", 7, rollbackEvent={}),
        entry("HEARTBEAT", 8, heartbeatEvent=dict(epoch=1621236162)),
        entry("CHECKPOINT", 9, checkpointEvent=dict(syncedGtid="3e11fa47:1-23", fakeGtid=True,
                                                    fileName="mysql-bin.000042", position=4)),
        entry("BEGIN", 2**64 - 1, beginEvent={}),
    ]


def test_rich_entries_cover_every_kind(spec):
    kinds = {(e.header.messageType, e.event.dmlEvent.dmlEventType if e.event.HasField("dmlEvent") else None)
             for e in rich_entries(spec)}
    assert {k for k, _ in kinds} == set(SPEC_ENUMS["MessageType"].values())
    assert {d for k, d in kinds if k == pb.DML} == set(SPEC_ENUMS["DMLType"].values())
    assert rich_entries(spec)[6].event.HasField("rollbackEvent")


@pytest.mark.parametrize("segment", [40, 1000, 10**6])
def test_project_reads_what_the_spec_encoder_writes(spec, segment):
    spec_items = rich_entries(spec)
    data = spec_frame(spec, [spec_items[:4], spec_items[4:5], spec_items[5:]], segment)
    got = project_read(data)
    assert [as_dict(e) for e in got] == [as_dict(e) for e in spec_items]
    assert [e.SerializeToString() for e in got] == [e.SerializeToString() for e in spec_items]
    assert got[1].event.dmlEvent.rows[0].newColumns[0].dataType == pb.UINT64
    assert got[6].event.HasField("rollbackEvent") and not got[6].event.HasField("beginEvent")


@pytest.mark.parametrize("max_size", [64, 300, 1 << 20])
def test_spec_decoder_reads_what_the_project_writes(spec, max_size):
    project_items = [pb.Entry.FromString(e.SerializeToString()) for e in rich_entries(spec)]
    out = io.BytesIO()
    write_pb(out, pack_entries(project_items, max_message_bytes=max_size))
    got = spec_unframe(spec, out.getvalue())
    assert [as_dict(e) for e in got] == [as_dict(e) for e in project_items]


def to_spec(spec, entry: pb.Entry):
    return json_format.ParseDict(json_format.MessageToDict(entry), spec.Entry())


@given(entry_streams(max_size=6), st.integers(30, 2000))
def test_generated_streams_cross_between_the_two_encoders(spec, entry_list, segment):
    spec_items = [to_spec(spec, e) for e in entry_list]
    groups = [spec_items[i:i + 2] for i in range(0, len(spec_items), 2)]
    assert project_read(spec_frame(spec, groups, segment)) == entry_list
    out = io.BytesIO()
    write_pb(out, pack_entries(entry_list, max_message_bytes=segment + 64))
    assert [as_dict(e) for e in spec_unframe(spec, out.getvalue())] == [as_dict(e) for e in entry_list]


def test_unknown_enum_numbers_and_fields_survive_reassembly():
    entry = pb.Entry(header=pb.Header(version=1, messageType=42, sourceType=9))
    entry.event.dmlEvent.rows.add().newColumns.add(dataType=99, sv="x")
    unknown = varint(20 << 3) + varint(5)  # field 20, varint 5: in no message of the wire format
    data = b"\x0a" + varint(len(entry.SerializeToString() + unknown)) + entry.SerializeToString() + unknown
    [whole] = Reassembler().feed(0, 0, pb.Envelope(version=1, total=1, data=data).SerializeToString())
    assert whole.entries.SerializeToString() == data
    assert whole.entries.items[0].event.dmlEvent.rows[0].newColumns[0].dataType == 99


# ---- the shared strategies generate what the wire format describes (docs/mapping.md, "Column types") ---

EVENT_OF = {pb.BEGIN: "beginEvent", pb.COMMIT: "commitEvent", pb.DML: "dmlEvent", pb.DDL: "ddlEvent",
            pb.ROLLBACK: "rollbackEvent", pb.HEARTBEAT: "heartbeatEvent", pb.CHECKPOINT: "checkpointEvent"}
INT_BITS = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "bigint": 64}
SIGNED = {"tinyint": pb.INT8, "smallint": pb.INT16, "mediumint": pb.INT32, "int": pb.INT32, "bigint": pb.INT64}
UNSIGNED = {"tinyint": pb.UINT8, "smallint": pb.UINT16, "mediumint": pb.UINT32, "int": pb.UINT32,
            "bigint": pb.UINT64}
BYTES_FAMILIES = {"tinyblob", "blob", "mediumblob", "longblob", "geometry", "json"}
TEXT_FAMILIES = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}


def frac(fsp: int) -> str:
    return rf"\.\d{{{fsp}}}" if fsp else ""


def temporal_pattern(family: str, fsp: int) -> str:
    day = r"\d{4}-\d{2}-\d{2}"
    clock = r"\d{2}:\d{2}:\d{2}" + frac(fsp)
    return {"date": day, "datetime": f"{day} {clock}", "timestamp": rf"{day} {clock} [+-]\d{{2}}:\d{{2}}",
            "time": r"-?\d{2,3}:[0-5]\d:[0-5]\d" + frac(fsp)}[family]


def check_value(type_text: str, data: pb.Data):
    """Assert `data` is a canonical value of a column of `type_text` (docs/mapping.md, "Column types")."""
    t = parse_mysql_type(type_text)
    family = t.family
    if data.dataType == pb.NIL or data.dataType == pb.NA:
        assert data == pb.Data(dataType=data.dataType)
        return
    if family in INT_BITS or family in ("bool", "bit", "year"):
        value = int(data.sv)
        assert str(value) == data.sv and data == pb.Data(dataType=data.dataType, sv=data.sv)
        if family in INT_BITS:
            bits = INT_BITS[family]
            assert data.dataType == (UNSIGNED if t.unsigned else SIGNED)[family]
            low, high = (0, 2**bits - 1) if t.unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        elif family == "bool":
            assert data.dataType == pb.INT8
            low, high = -128, 127
        elif family == "bit":
            assert data.dataType == (pb.UINT64 if value >= 2**63 else pb.INT64)
            low, high = 0, 2 ** t.args[0] - 1
        else:
            assert data.dataType == pb.INT64
            low, high = (0, 0) if value == 0 else (1901, 2155)
        assert low <= value <= high
    elif family in ("float", "double"):
        assert data.dataType == (pb.FLOAT32 if family == "float" else pb.FLOAT64)
        value = float(data.sv)
        assert math.isfinite(value) and repr(value) == data.sv and data == pb.Data(dataType=data.dataType, sv=data.sv)
        if family == "float":
            assert struct.unpack("f", struct.pack("f", value))[0] == value
    elif family == "decimal":
        precision, scale = t.args
        assert data.dataType == pb.DECIMAL and data == pb.Data(dataType=pb.DECIMAL, sv=data.sv)
        match = re.fullmatch(r"(-?)(0|[1-9]\d*)" + frac(scale), data.sv)
        assert match, data.sv
        assert len(match.group(2).lstrip("0")) <= precision - scale
        assert not (match.group(1) and set(data.sv) <= set("-0."))
    elif family in BYTES_FAMILIES:
        assert data == pb.Data(dataType=pb.BYTES, bv=data.bv)
        if family == "json":
            json.loads(data.bv.decode("utf-8"))
    elif family in ("binary", "varbinary"):
        assert data == pb.Data(dataType=pb.STRING, charset="binary", bv=data.bv)
        assert len(data.bv) == t.args[0] if family == "binary" else len(data.bv) <= t.args[0]
    elif family in TEXT_FAMILIES:
        assert data == pb.Data(dataType=pb.STRING, charset=data.charset, bv=data.bv)
        codec, top = MYSQL_CHARSETS[data.charset]
        text = data.bv.decode(codec)
        assert all(ord(c) <= top for c in text)
        if family == "enum":
            assert text in t.args or text == ""
        elif family == "set":
            assert text == "" or all(m in t.args for m in text.split(","))
    else:
        assert data == pb.Data(dataType=pb.STRING, bv=data.bv)
        text = data.bv.decode("ascii")
        fsp = t.args[0] if t.args else 0
        assert re.fullmatch(temporal_pattern(family, fsp), text), text
        if text.startswith("0000-00-00"):
            return
        if family == "date":
            date.fromisoformat(text)
        elif family in ("datetime", "timestamp"):
            datetime.strptime(text[:19], "%Y-%m-%d %H:%M:%S")
        if family == "timestamp":
            sign, hours, minutes = text[-6], int(text[-5:-3]), int(text[-2:])
            assert -12 * 60 <= (minutes + 60 * hours) * (-1 if sign == "-" else 1) <= 14 * 60
            assert not (sign == "-" and hours == minutes == 0)
        if family == "time":
            hours, minutes, seconds = text.lstrip("-").split(":")
            assert (int(hours) * 60 + int(minutes)) * 60 + float(seconds) <= 838 * 3600 + 59 * 60 + 59
            assert not (text.startswith("-") and set(text[1:]) <= set("0:."))


def check_properties(message):
    keys = [kv.key for kv in message.properties]
    assert len(keys) == len(set(keys)) and not any(k.startswith(RESERVED_PREFIX) for k in keys)


def check_canonical(entry: pb.Entry):
    header, event = entry.header, entry.event
    assert header.version == 1
    assert header.sourceType in SPEC_ENUMS["SourceType"].values()
    present = [f.name for f, _ in event.ListFields() if f.name != "properties"]
    assert present == [EVENT_OF[header.messageType]]
    bare = pb.Entry()
    bare.CopyFrom(entry)
    bare.DiscardUnknownFields()
    assert bare.SerializeToString() == entry.SerializeToString()
    check_properties(header)
    check_properties(event)
    if header.messageType != pb.DML:
        return
    dml = event.dmlEvent
    assert header.schemaName and header.tableName
    assert 1 <= len(dml.rows) <= 4 and len(dml.columns) >= 1
    names = [c.name.casefold() for c in dml.columns]
    assert len(set(names)) == len(names)
    for column in dml.columns:
        check_properties(column)
    old_full = dml.dmlEventType in (pb.UPDATE, pb.DELETE)
    new_full = dml.dmlEventType in (pb.UPDATE, pb.INSERT)
    for row in dml.rows:
        check_properties(row)
        assert len(row.oldColumns) == (len(dml.columns) if old_full else 0)
        assert len(row.newColumns) == (len(dml.columns) if new_full else 0)
        for image in (row.oldColumns, row.newColumns):
            for column, data in zip(dml.columns, image):
                check_value(column.originalType, data)
                if column.isKey:
                    assert data.dataType not in (pb.NIL, pb.NA)


@given(entries())
def test_strategies_generate_canonical_entries(entry):
    check_canonical(entry)


@given(entry_streams(min_size=2))
def test_entry_streams_have_strictly_increasing_seq_ids(entry_list):
    seq_ids = [e.header.seqId for e in entry_list]
    assert all(a < b for a, b in zip(seq_ids, seq_ids[1:]))


@pytest.mark.parametrize("type_text, data", [
    ("int(11)", pb.Data(dataType=pb.INT32, sv="007")),
    ("int(10) unsigned", pb.Data(dataType=pb.INT32, sv="7")),
    ("tinyint(4)", pb.Data(dataType=pb.INT8, sv="128")),
    ("bit(64)", pb.Data(dataType=pb.INT64, sv=str(2**63))),
    ("double", pb.Data(dataType=pb.FLOAT64, sv="1.50")),
    ("decimal(5,2)", pb.Data(dataType=pb.DECIMAL, sv="1234.00")),
    ("decimal(5,2)", pb.Data(dataType=pb.DECIMAL, sv="-0.00")),
    ("varchar(3)", pb.Data(dataType=pb.STRING, charset="ascii", bv="é".encode())),
    ("datetime(2)", pb.Data(dataType=pb.STRING, bv=b"2021-05-17 07:22:42.1")),
    ("timestamp", pb.Data(dataType=pb.STRING, bv=b"2021-05-17 07:22:42 +15:00")),
    ("time", pb.Data(dataType=pb.STRING, bv=b"-00:00:00")),
    ("json", pb.Data(dataType=pb.BYTES, charset="utf8", bv=b"{}")),
    ("date", pb.Data(dataType=pb.NA, sv="x")),
])
def test_the_canonical_check_rejects_non_canonical_values(type_text, data):
    with pytest.raises((AssertionError, ValueError, UnicodeDecodeError)):
        check_value(type_text, data)


@given(ddl_statements())
def test_ddl_statements_start_with_their_keywords_after_comments(statement):
    sql, op = statement
    body = re.sub(r"^(\s+|/\*.*?\*/|(--|#)[^\n]*\n)*", "", sql, flags=re.S)
    first = body.split()[0].upper()
    assert first == {"ERASE": "DROP", "CINDEX": "CREATE", "DINDEX": "DROP"}.get(op, op) or op == "QUERY"
