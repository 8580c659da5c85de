"""The in-process cases (a) to (e): each takes a prepared Chunk and returns how many items it made.

Every case starts from the same input a consumer has: one Entry's bytes (the DTS side) or one
JSON line (the Blob side), and ends with bytes (JSON or protobuf), so that all do the same job.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from google.protobuf import json_format

import bridge
from bridge import pb

LOSSLESS = bridge.DEFAULT_OPTIONS
STRICT = bridge.Options(strict=True)
_Entry = pb.Entry
_from_string = pb.Entry.FromString


@dataclass
class Chunk:
    """One slice of the workload, with every case's input built once beforehand (untimed)."""
    rows: int
    entry_bytes: list        # DTS side: one Entry's encoding each
    blob: dict               # options name -> Blob message dicts (the floor's input)
    blob_lines: dict         # options name -> Blob JSON lines (the Blob side's input)
    naive_lines: list        # protobuf canonical JSON of each Entry (the naive Blob side's input)
    entries: list            # pb.Entry (the Blob -> DTS floor's serialise input)
    # the Tuple side's input: per table (and column set), in order of first appearance,
    # (RecordSchema, "db.table", DTS columns, Tuple rows), as `convert --to tuple` writes one file each
    tuples: list = field(default_factory=list)


OPTIONS = {"lossless": LOSSLESS, "strict": STRICT}


def prepare(entries: list, rows: int) -> Chunk:
    blob, lines = {}, {}
    for name, options in OPTIONS.items():
        encoder = bridge.BlobEncoder(options)
        blob[name] = [m for e in entries for m in encoder.convert(e)]
        lines[name] = [bridge.encode_blob(m) for m in blob[name]]
    naive = [json.dumps(json_format.MessageToDict(e)).encode() for e in entries]
    return Chunk(rows, [e.SerializeToString() for e in entries], blob, lines, naive, entries,
                 _tuple_files(entries))


def _tuple_files(entries: list) -> list:
    """The Tuple rows of `entries` (lossless, default options) grouped per table and column set."""
    encoder = bridge.TupleEncoder(LOSSLESS)
    files: dict = {}
    for entry in entries:
        rows = encoder.convert(entry)
        if not rows:
            continue
        h, columns = entry.header, entry.event.dmlEvent.columns
        key = (h.schemaName, h.tableName, b"".join(c.SerializeToString() for c in columns))
        if key not in files:
            files[key] = (encoder.schema(columns), f"{h.schemaName}.{h.tableName}", list(columns), [])
        files[key][3].extend(rows)
    return list(files.values())


# ---- (a) the naive baseline and (b) the bridge, DTS -> Blob -----------------------------------

def naive_dts_to_blob(chunk: Chunk) -> int:
    """Per Entry: parse, protobuf's own JSON mapping (MessageToDict), json.dumps."""
    n = 0
    for raw in chunk.entry_bytes:
        json.dumps(json_format.MessageToDict(_from_string(raw))).encode()
        n += 1
    return n


def _bridge_dts_to_blob(options: bridge.Options) -> Callable[[Chunk], int]:
    """What the CLI, `consume` and `entries_to_blob_lines` do: parse, then `convert_lines` with the
    Entry's bytes (plain DML Entries are written to JSON lines in C, the rest through the dicts)."""
    def run(chunk: Chunk) -> int:
        encoder = bridge.BlobEncoder(options)
        convert = encoder.convert_lines
        n = 0
        for raw in chunk.entry_bytes:
            n += len(convert(_from_string(raw), raw))
        return n
    return run


def _bridge_dts_to_blob_dicts(use_raw: bool) -> Callable[[Chunk], int]:
    """The dict API: `convert` (with the Entry's bytes: row images read in C; without: all Python)
    and `encode_blob` of each message, as the Spark transform does."""
    def run(chunk: Chunk) -> int:
        encoder = bridge.BlobEncoder()
        encode = bridge.encode_blob
        n = 0
        for raw in chunk.entry_bytes:
            for msg in encoder.convert(_from_string(raw), raw if use_raw else None):
                encode(msg)
                n += 1
        return n
    return run


def bridge_entry_to_blob(chunk: Chunk) -> int:
    """The pure functions a library user calls: parse, `entry_to_blob(entry)` (which serialises a
    DML Entry once for the C path) and `encode_blob` of each message."""
    entry_to_blob, encode = bridge.entry_to_blob, bridge.encode_blob
    n = 0
    for raw in chunk.entry_bytes:
        for msg in entry_to_blob(_from_string(raw)):
            encode(msg)
            n += 1
    return n


def bridge_entries_to_blob_lines(chunk: Chunk) -> int:
    """The batch form: `entries_to_blob_lines` of the chunk's Entry encodings."""
    return len(bridge.entries_to_blob_lines(chunk.entry_bytes))


# ---- (c) the floors ---------------------------------------------------------------------------

def parse_floor(chunk: Chunk) -> int:
    for raw in chunk.entry_bytes:
        _from_string(raw)
    return len(chunk.entry_bytes)


def _dumps_floor(name: str) -> Callable[[Chunk], int]:
    def run(chunk: Chunk) -> int:
        dumps = orjson.dumps
        for msg in chunk.blob[name]:
            dumps(msg)
        return len(chunk.blob[name])
    return run


def entry_api_floor(chunk: Chunk) -> int:
    """What `entry_to_blob` + `encode_blob` cannot avoid, its dicts built for free: parse each Entry
    (as the caller does), serialise it again (the bytes C reads the rows from) and `orjson.dumps`
    the prebuilt lossless message dicts."""
    for raw in chunk.entry_bytes:
        _from_string(raw).SerializeToString()
    dumps = orjson.dumps
    for msg in chunk.blob["lossless"]:
        dumps(msg)
    return len(chunk.entry_bytes)


def python_read_floor(chunk: Chunk) -> int:
    """Parse, then read dataType, sv and bv of every Data in Python: the least any pure-Python
    converter over protobuf's messages does, before converting or serialising anything."""
    for raw in chunk.entry_bytes:
        for row in _from_string(raw).event.dmlEvent.rows:
            for d in row.oldColumns:
                d.dataType, d.sv, d.bv  # noqa: B018  (the reads are the point)
            for d in row.newColumns:
                d.dataType, d.sv, d.bv  # noqa: B018
    return len(chunk.entry_bytes)


# ---- (d) Blob -> DTS --------------------------------------------------------------------------

def _bridge_blob_to_dts(name: str) -> Callable[[Chunk], int]:
    options = OPTIONS[name]

    def run(chunk: Chunk) -> int:
        decoder = bridge.BlobDecoder(options)
        feed_line = decoder.feed_line  # what the stream layer (CLI, consume) and Spark call per line
        n = 0
        for line in chunk.blob_lines[name]:
            for entry in feed_line(line):
                entry.SerializeToString()
                n += 1
        if decoder.finish():
            raise RuntimeError("Blob -> DTS left messages unpaired")
        return n
    return run


def naive_blob_to_dts(chunk: Chunk) -> int:
    """Per line: json.loads, protobuf's ParseDict of the MessageToDict form, serialise."""
    for line in chunk.naive_lines:
        entry = _Entry()
        json_format.ParseDict(json.loads(line), entry)
        entry.SerializeToString()
    return len(chunk.naive_lines)


def blob_to_dts_floor(chunk: Chunk) -> int:
    """orjson.loads of the lossless lines plus serialising the equivalent Entries."""
    loads = orjson.loads
    for line in chunk.blob_lines["lossless"]:
        loads(line)
    for entry in chunk.entries:
        entry.SerializeToString()
    return len(chunk.entries)


_NIL, _STRING = int(pb.NIL), int(pb.STRING)


def python_build_floor(chunk: Chunk) -> int:
    """orjson.loads of each lossless line, then one Data per value added through protobuf's
    `add()` (no type conversion), and serialise: the least a pure-Python Blob -> DTS decoder does."""
    loads = orjson.loads
    for line in chunk.blob_lines["lossless"]:
        payload = loads(line)["payload"]
        entry = _Entry()
        entry.header.seqId = int(payload["sequenceId"]) // 1_000_000
        row = entry.event.dmlEvent.rows.add()
        for image, target in (("before", row.oldColumns), ("after", row.newColumns)):
            if image in payload:
                add = target.add
                for value in payload[image]["dataColumn"].values():
                    if value is None:
                        add(dataType=_NIL)
                    else:
                        add(dataType=_STRING, sv=str(value))
        entry.SerializeToString()
    return len(chunk.blob_lines["lossless"])


# ---- (e) DTS -> Tuple -------------------------------------------------------------------------

def _bridge_dts_to_tuple(native: bool) -> Callable[[Chunk], int]:
    """Per Entry: parse and TupleEncoder.convert with the Entry's bytes (rows as dicts of typed
    values; with `native`, the values C takes are read off the bytes, the rest in Python)."""
    def run(chunk: Chunk) -> int:
        convert = bridge.TupleEncoder(native=native).convert
        n = 0
        for raw in chunk.entry_bytes:
            n += len(convert(_from_string(raw), raw))
        return n
    return run


bridge_dts_to_tuple = _bridge_dts_to_tuple(True)


# ---- (e) Tuple -> DTS -------------------------------------------------------------------------

def bridge_tuple_to_dts(chunk: Chunk) -> int:
    """Per table: a TupleDecoder with the RecordSchema, table and DTS columns `convert` writes next
    to a Tuple file (as `convert --from tuple` reads them back), `feed` of each row and
    `SerializeToString` of each Entry it completes."""
    n = 0
    for schema, table, columns, rows in chunk.tuples:
        decoder = bridge.TupleDecoder(schema, LOSSLESS, table=table, columns=columns)
        feed = decoder.feed
        for row in rows:
            for entry in feed(row):
                entry.SerializeToString()
                n += 1
        if decoder.finish():
            raise RuntimeError("Tuple -> DTS left update halves unpaired")
    return n


# name -> (what it measures, function); the order is the table's.
CASES: dict[str, tuple[str, Callable[[Chunk], int]]] = {
    "naive_dts_to_blob": ("(a) naive DTS -> JSON: parse + MessageToDict + json.dumps", naive_dts_to_blob),
    "dts_to_blob": ("(b) bridge DTS -> Blob, lossless (default)", _bridge_dts_to_blob(LOSSLESS)),
    "dts_to_blob_strict": ("(b) bridge DTS -> Blob, strict", _bridge_dts_to_blob(STRICT)),
    "dts_to_blob_dicts": ("(b) dict API: convert(entry, raw) + encode_blob (images in C)",
                          _bridge_dts_to_blob_dicts(True)),
    "dts_to_blob_python": ("(b) pure Python: convert(entry) + encode_blob (the reference path)",
                           _bridge_dts_to_blob_dicts(False)),
    "dts_to_blob_entry_api": ("(b) pure functions: entry_to_blob(entry) + encode_blob", bridge_entry_to_blob),
    "dts_to_blob_batch": ("(b) batch form: entries_to_blob_lines(Entry encodings)", bridge_entries_to_blob_lines),
    "parse_floor": ("(c) floor: Entry.ParseFromString", parse_floor),
    "dumps_floor": ("(c) floor: orjson.dumps of prebuilt lossless Blob dicts", _dumps_floor("lossless")),
    "dumps_floor_strict": ("(c) floor: orjson.dumps of prebuilt strict Blob dicts", _dumps_floor("strict")),
    "entry_api_floor": ("(c) entry API floor: parse + SerializeToString + orjson.dumps of prebuilt lossless dicts",
                        entry_api_floor),
    "python_read_floor": ("(c) Python floor: parse + read dataType, sv, bv of every Data", python_read_floor),
    "blob_to_dts": ("(d) bridge Blob -> DTS, lossless: BlobDecoder.feed_line + serialise", _bridge_blob_to_dts("lossless")),
    "blob_to_dts_strict": ("(d) bridge Blob -> DTS, strict lines and options", _bridge_blob_to_dts("strict")),
    "naive_blob_to_dts": ("(d) naive JSON -> DTS: json.loads + ParseDict + serialise", naive_blob_to_dts),
    "blob_to_dts_floor": ("(d) floor: orjson.loads + Entry.SerializeToString", blob_to_dts_floor),
    "python_build_floor": ("(d) Python floor: orjson.loads + one Data per value via add() + serialise",
                           python_build_floor),
    "dts_to_tuple": ("(e) bridge DTS -> Tuple: parse + TupleEncoder.convert(entry, raw)", bridge_dts_to_tuple),
    "dts_to_tuple_python": ("(e) pure Python: parse + TupleEncoder(native=False).convert (the reference path)",
                            _bridge_dts_to_tuple(False)),
    "tuple_to_dts": ("(e) bridge Tuple -> DTS: TupleDecoder.feed (RecordSchema, table, DTS columns) + serialise",
                     bridge_tuple_to_dts),
}
