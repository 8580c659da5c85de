"""The committed sample streams: deterministic, complete and internally consistent.

The checks on values restate the value encoding (docs/mapping.md) independently of the generator, so a wrong sample
fails here rather than teaching the converters a wrong format.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge.samples import STREAM_MESSAGE_BYTES, build_sample_entries, build_sample_wire, stream_summary, write_samples
from bridge.samples.values import REAL_ORDERS, realistic_entries
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import Assembled, Reassembler, entry_from_json_line, read_dts_json, read_pb

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
REGENERATE = "python -c \"from bridge.samples import write_samples; write_samples('samples')\""

EVENT_FIELD = {pb.BEGIN: "beginEvent", pb.COMMIT: "commitEvent", pb.DML: "dmlEvent", pb.DDL: "ddlEvent",
               pb.ROLLBACK: "rollbackEvent", pb.HEARTBEAT: "heartbeatEvent", pb.CHECKPOINT: "checkpointEvent"}

# docs/mapping.md, "Column types": MySQL type family -> DataType (signed, unsigned).
INTEGER_TYPES = {"tinyint": (pb.INT8, pb.UINT8), "smallint": (pb.INT16, pb.UINT16),
                 "mediumint": (pb.INT32, pb.UINT32), "int": (pb.INT32, pb.UINT32),
                 "bigint": (pb.INT64, pb.UINT64)}
TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
BLOBS = {"json", "tinyblob", "blob", "mediumblob", "longblob", "geometry"}
TEMPORAL = {"date": r"\d{4}-\d\d-\d\d", "datetime": r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dFRAC",
            "timestamp": r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dFRAC [+-]\d\d:\d\d", "time": r"-?\d{2,3}:\d\d:\d\dFRAC"}
CODECS = {"utf8mb4": "utf-8", "utf8": "utf-8", "utf8mb3": "utf-8", "latin1": "cp1252", "gbk": "gbk",
          "gb18030": "gb18030", "big5": "big5"}
FAMILIES = set(INTEGER_TYPES) | TEXT | BLOBS | set(TEMPORAL) | {
    "float", "double", "decimal", "bit", "year", "binary", "varbinary"}


@pytest.fixture(scope="module")
def streams() -> dict[str, list[pb.Entry]]:
    return build_sample_entries()


def _values(streams):
    """Every (stream, Column, Data) in every row image."""
    for name, entries in streams.items():
        for entry in entries:
            dml = entry.event.dmlEvent
            for row in dml.rows:
                for image in (row.oldColumns, row.newColumns):
                    for column, data in zip(dml.columns, image):
                        yield name, column, data


def _family(original_type: str) -> str:
    return re.match(r"[a-z]+", original_type).group(0)


def test_generation_is_deterministic_and_matches_the_committed_files(tmp_path):
    first = write_samples(tmp_path / "a")
    second = write_samples(tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in second]
    assert sorted(p.name for p in SAMPLES.iterdir() if p.suffix in (".pb", ".jsonl")) == \
        sorted(p.name for p in first), f"samples/ is stale: regenerate with {REGENERATE}"
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes(), a.name
        assert a.read_bytes() == (SAMPLES / a.name).read_bytes(), \
            f"samples/{a.name} differs from the generator: regenerate with {REGENERATE}"
    assert sum(p.stat().st_size for p in first) < 1_000_000


def test_pb_and_dts_json_hold_the_same_entries(streams):
    for name, expected in streams.items():
        reassembler, from_pb = Reassembler(), []
        for number, _, raw in read_pb(SAMPLES / f"{name}.pb"):
            for out in reassembler.feed(0, number, raw):
                assert isinstance(out, Assembled), out
                from_pb.extend(out.entries.items)
        assert reassembler.finish() == []
        from_json = [entry_from_json_line(line, n) for n, line in read_dts_json(SAMPLES / f"{name}.dts.jsonl")]
        assert from_pb == expected, name
        assert from_json == expected, name


def test_some_entries_span_several_envelopes():
    totals = []
    for number, _, raw in read_pb(SAMPLES / "large.pb"):
        env = pb.Envelope.FromString(raw)
        assert env.version == 1 and env.index < env.total
        assert len(raw) <= STREAM_MESSAGE_BYTES["large"]
        totals.append(env.total)
    assert max(totals) > 2 and totals.count(1) > 0


def test_readme_describes_every_stream(streams):
    readme = (SAMPLES / "README.md").read_text(encoding="utf-8")
    wire = build_sample_wire()
    for name, entries in streams.items():
        assert stream_summary(name, entries, wire[name]) in readme, \
            f"update the table row for {name} in samples/README.md"


def test_every_message_type_appears(streams):
    seen = {e.header.messageType for entries in streams.values() for e in entries}
    assert seen == set(pb.MessageType.values())


def test_every_data_type_appears(streams):
    seen = {data.dataType for _, _, data in _values(streams)}
    assert seen == set(pb.DataType.values())


def test_every_mysql_type_family_and_charset_appears(streams):
    types = {column.originalType for _, column, _ in _values(streams)}
    assert {_family(t) for t in types} >= FAMILIES
    for family in INTEGER_TYPES:
        assert any(t.startswith(family + "(") and t.endswith(" unsigned") for t in types), family
    assert {"datetime(6)", "timestamp(3)", "tinyint(1)", "bit(1)", "bit(64)", "decimal(30,9)"} <= types
    charsets = {data.charset for _, _, data in _values(streams)}
    assert charsets == set(CODECS) | {"binary", ""}
    assert {pb.MYSQL, pb.MARIADB} == {es[0].header.sourceType for es in streams.values()}


def test_values_are_encoded_as_the_spec_says(streams):
    for name, column, data in _values(streams):
        where = f"{name}: {column.name} {column.originalType} {data}"
        if data.dataType in (pb.NIL, pb.NA):
            assert data == pb.Data(dataType=data.dataType), where
            continue
        family, unsigned = _family(column.originalType), column.originalType.endswith(" unsigned")
        fsp = re.search(r"\((\d+)\)", column.originalType)
        if family in INTEGER_TYPES:
            assert data.dataType == INTEGER_TYPES[family][unsigned] and re.fullmatch(r"-?\d+", data.sv), where
        elif family in ("bit", "year"):
            limit = 2 ** 63 - 1
            assert data.dataType == (pb.INT64 if int(data.sv) <= limit else pb.UINT64), where
        elif family in ("float", "double"):
            assert data.dataType == (pb.FLOAT32 if family == "float" else pb.FLOAT64), where
            assert abs(float(data.sv)) < float("inf"), where
        elif family == "decimal":
            scale = int(re.search(r",(\d+)\)", column.originalType).group(1))
            assert data.dataType == pb.DECIMAL and len(data.sv.partition(".")[2]) == scale, where
        elif family in TEXT:
            assert data.dataType == pb.STRING and data.bv.decode(CODECS[data.charset]) is not None, where
        elif family in ("binary", "varbinary"):
            assert data.dataType == pb.STRING and data.charset == "binary", where
        elif family in BLOBS:
            assert data.dataType == pb.BYTES and not data.charset, where
            if family == "json":
                data.bv.decode("utf-8")
        elif family in TEMPORAL:
            frac = rf"\.\d{{{fsp.group(1)}}}" if fsp else ""
            # DTS may or may not name a charset on temporal text (undocumented): realistic has both
            assert data.dataType == pb.STRING and data.charset in ("", "utf8mb4", "binary"), where
            assert not data.charset or name == "realistic", where
            assert re.fullmatch(TEMPORAL[family].replace("FRAC", frac), data.bv.decode("ascii")), where
        else:
            pytest.fail(f"unexpected type family: {where}")
        if data.dataType != pb.STRING and data.dataType != pb.BYTES:
            assert not data.bv and not data.charset, where


def test_edge_values_appear(streams):
    sv = {(c.originalType, d.sv) for _, c, d in _values(streams) if d.sv}
    text = {(d.charset, d.bv) for _, _, d in _values(streams) if d.dataType == pb.STRING}
    blobs = {d.bv for _, _, d in _values(streams) if d.dataType == pb.BYTES}
    for width, (lo, hi) in {"tinyint(4)": (-128, 127), "smallint(6)": (-32768, 32767),
                            "mediumint(9)": (-8388608, 8388607), "int(11)": (-2 ** 31, 2 ** 31 - 1),
                            "bigint(20)": (-2 ** 63, 2 ** 63 - 1), "tinyint(3) unsigned": (0, 255),
                            "smallint(5) unsigned": (0, 65535), "mediumint(8) unsigned": (0, 16777215),
                            "int(10) unsigned": (0, 2 ** 32 - 1), "bigint(20) unsigned": (0, 2 ** 64 - 1)}.items():
        assert {(width, str(lo)), (width, str(hi))} <= sv, width
    assert {("decimal(30,9)", "-999999999999999999999.999999999"), ("bit(64)", "18446744073709551615"),
            ("bit(1)", "1"), ("float", "3.4028235e+38"), ("double", "1.7976931348623157e+308"),
            ("double", "5e-324"), ("double", "-0.0"), ("year(4)", "2155")} <= sv
    assert {("", b"0000-00-00"), ("", b"0000-00-00 00:00:00"), ("", b"838:59:59"), ("", b"-12:00:00"),
            ("", b"2021-05-17 07:22:42.123456"), ("", b"2021-05-17 00:22:42.123 -07:00"),
            ("", b"2021-05-17 12:52:42 +05:30")} <= text
    assert any(cs == "latin1" and b"\x80" in bv for cs, bv in text)  # cp1252 euro sign
    assert any(cs == "utf8mb4" and "👍".encode() in bv for cs, bv in text)
    assert any(cs == "gb18030" and "😀".encode("gb18030") in bv for cs, bv in text)
    assert {cs for cs, bv in text if any(byte >= 0x80 for byte in bv)} >= {"gbk", "big5", "utf8", "utf8mb3"}
    assert bytes(range(256)) in blobs
    assert any("张三".encode() in bv for bv in blobs)  # json with unicode
    nil = {c.name for _, c, d in _values(streams) if d.dataType == pb.NIL}
    empty = {c.name for _, c, d in _values(streams) if d.dataType == pb.STRING and not d.bv}
    assert {"c_varchar", "phone"} <= nil & empty  # empty string and NULL are different values

def test_headers_are_consistent(streams):
    for name, entries in streams.items():
        source = entries[0].header.sourceType
        for before, entry in zip([None] + entries, entries):
            h = entry.header
            assert (h.version, h.sourceType, h.serverId) == (1, source, entries[0].header.serverId), name
            fields = [f.name for f, _ in entry.event.ListFields()]
            assert fields == [EVENT_FIELD[h.messageType]], (name, h.seqId)
            if before is None:
                assert h.seqId == 1
                continue
            b = before.header
            assert h.seqId == b.seqId + 1 and h.timestamp >= b.timestamp, (name, h.seqId)
            assert (h.fileName, h.position) >= (b.fileName, b.position), (name, h.seqId)


def test_transactions_are_well_formed(streams):
    for name, entries in streams.items():
        open_txn = None
        for entry in entries:
            h, kind = entry.header, entry.header.messageType
            if kind == pb.BEGIN:
                assert open_txn is None and re.fullmatch(r"\d+:\d+", entry.event.beginEvent.transactionId)
                open_txn = entry
            elif kind in (pb.DML, pb.COMMIT, pb.ROLLBACK):
                assert open_txn is not None and h.gtid == open_txn.header.gtid, (name, h.seqId)
                if kind == pb.COMMIT:
                    assert entry.event.commitEvent.transactionId == open_txn.event.beginEvent.transactionId
                if kind != pb.DML:
                    open_txn = None
            else:  # DDL, heartbeats and checkpoints fall between transactions
                assert open_txn is None, (name, h.seqId)
        kinds = [e.header.messageType for e in entries]
        last_work = max(i for i, k in enumerate(kinds) if k not in (pb.HEARTBEAT, pb.CHECKPOINT))
        assert open_txn is None and pb.CHECKPOINT in kinds[last_work:], name  # ends at a safe point


def test_row_images_align_with_columns(streams):
    for name, entries in streams.items():
        for entry in entries:
            dml = entry.event.dmlEvent
            for row in dml.rows:
                old, new = len(row.oldColumns), len(row.newColumns)
                expected = {pb.INSERT: (0, len(dml.columns)), pb.DELETE: (len(dml.columns), 0),
                            pb.UPDATE: (len(dml.columns), len(dml.columns))}[dml.dmlEventType]
                assert (old, new) == expected, (name, entry.header.seqId)
    dml = [e.event.dmlEvent for es in streams.values() for e in es if e.header.messageType == pb.DML]
    assert {d.dmlEventType for d in dml if len(d.rows) > 1} == {pb.INSERT, pb.UPDATE, pb.DELETE}
    # binlog_row_image=MINIMAL: the before image holds only the key, the after image only changes
    minimal = [r for d in dml if d.dmlEventType == pb.UPDATE for r in d.rows
               if [c.isKey for c in d.columns] == [x.dataType != pb.NA for x in r.oldColumns]]
    assert minimal and all(pb.NA in {x.dataType for x in r.newColumns} for r in minimal)

def test_split_rows_events_and_checkpoints(streams):
    pieces = [e.header for e in streams["large"] if e.header.messageType == pb.DML and not e.header.isLast]
    assert [h.eventIndex for h in pieces] == [0, 1]
    for name, entries in streams.items():
        times = [entries[0].header.timestamp] + [e.header.timestamp for e in entries
                                                 if e.header.messageType == pb.CHECKPOINT]
        assert max(b - a for a, b in zip(times, times[1:])) <= 15, name
        for entry in entries:
            if entry.header.messageType == pb.CHECKPOINT:
                cp = entry.event.checkpointEvent
                assert (cp.fileName, cp.position) == (entry.header.fileName, entry.header.position)
                assert cp.syncedGtid


def test_ddl_statements_cover_every_kind(streams):
    sql = [e.event.ddlEvent.sql for es in streams.values() for e in es if e.header.messageType == pb.DDL]
    comment = re.compile(r"\s+|/\*.*?\*/|--[^\n]*\n|#[^\n]*\n", re.S)

    def keywords(text: str) -> str:
        while (m := comment.match(text)) and m.end():
            text = text[m.end():]
        words = text.upper().replace("UNIQUE ", "").split()
        return " ".join(words[:2])

    kinds = {keywords(s) for s in sql}
    assert {"CREATE TABLE", "ALTER TABLE", "DROP TABLE", "TRUNCATE TABLE", "RENAME TABLE", "CREATE INDEX",
            "DROP INDEX", "CREATE DATABASE", "GRANT SELECT"} <= kinds
    assert {s[:2] for s in sql} >= {"/*", "--", "# ", "  "}
    assert any("`" in s for s in sql) and any("TrUnCaTe" in s for s in sql)


# ---- realistic: a subscription as DTS writes it (samples/README.md) ------------------------------

def _shapes(entries) -> set:
    """The value shapes of a stream's row images (documented in samples/README.md, `realistic`)."""
    out = set()
    for entry in entries:
        dml = entry.event.dmlEvent
        for row in dml.rows:
            for image in (row.oldColumns, row.newColumns):
                for column, data in zip(dml.columns, image):
                    family = _family(column.originalType)
                    if family in TEXT and data.bv:
                        out.add(("text", data.charset))
                    elif family in TEMPORAL and family != "time" and data.dataType == pb.STRING:
                        text = data.bv.decode("ascii")
                        out.add(("temporal charset", data.charset))
                        out |= {("zero date", family)} if text.startswith("0000-00-00") else set()
                        out |= {("timestamp +00:00",)} if family == "timestamp" and text.endswith(" +00:00") else set()
                        out |= {("microseconds",)} if re.search(r"\.\d{6}$", text) and text[-3:] != "000" else set()
                    elif family == "double" and "." not in data.sv and data.sv:
                        out.add(("double without a point", data.sv))
                    elif family in ("bit", "year"):
                        out.add((family, pb.DataType.Name(data.dataType)))
                    elif family in ("json", "blob", "geometry") and data.dataType == pb.BYTES:
                        out.add(("bytes", family))
    return out


REAL_SHAPES = {("text", "utf8"), ("text", "utf8mb4"), ("text", "gbk"), ("text", "latin1"),
               ("temporal charset", ""), ("temporal charset", "utf8mb4"), ("temporal charset", "binary"),
               ("zero date", "date"), ("zero date", "datetime"), ("timestamp +00:00",), ("microseconds",),
               ("double without a point", "1"), ("bit", "INT64"), ("year", "INT64"), ("bytes", "json"),
               ("bytes", "blob"), ("bytes", "geometry")}


def test_realistic_holds_every_documented_shape(streams):
    entries = streams["realistic"]
    assert _shapes(entries) >= REAL_SHAPES
    dml = [e for e in entries if e.header.messageType == pb.DML]
    assert all(e.header.properties for e in entries)  # header properties on every Entry
    assert {e.header.tableName for e in dml} == {"orders", "suppliers"}
    suppliers = next(e for e in dml if e.header.tableName == "suppliers")
    assert {d.charset for d in suppliers.event.dmlEvent.rows[0].newColumns if d.bv} >= {"gbk"}  # a gbk table


def test_realistic_writes_null_both_ways():
    """NULL as an empty Data and as NIL written out (08 00): both parse to the same Data."""
    raws = build_sample_wire()["realistic"]
    explicit = sum(raw.count(b"\x12\x02\x08\x00") + raw.count(b"\x0a\x02\x08\x00") for raw in raws)
    empty = sum(raw.count(b"\x12\x00") + raw.count(b"\x0a\x00") for raw in raws)
    assert explicit and empty
    assert all(pb.Entry.FromString(raw).SerializeToString() != raw for raw in raws if b"\x02\x08\x00" in raw)


def test_realistic_entries_give_the_benchmarks_the_same_shapes():
    """`realistic_entries` (the benchmarks' realistic mix) makes REAL_ORDERS rows as the sample does."""
    raws = realistic_entries(40, seed=3, rows_per_entry=2)
    assert raws == realistic_entries(40, seed=3, rows_per_entry=2)
    entries = [pb.Entry.FromString(raw) for raw in raws]
    assert _shapes(entries) >= REAL_SHAPES
    assert all(e.header.properties and len(e.event.dmlEvent.columns) == len(REAL_ORDERS.cols) for e in entries)
