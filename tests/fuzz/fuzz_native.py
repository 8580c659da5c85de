"""Coverage-guided fuzzing of the C fast path against the pure-Python path (atheris).

    .venv/bin/python tests/fuzz/fuzz_native.py [libFuzzer flags] [corpus dirs]   (make fuzz)

Each input becomes one DTS Entry (or Blob lines) and goes through every face twice, with the C
path on and off: DTS -> Blob lines (`BlobEncoder.convert_lines(entry, raw)` against the Python
path's lines), DTS -> Tuple rows (`TupleEncoder(native=True)` against `native=False`) and, on the
Blob messages that came out, Blob -> DTS (`BlobDecoder` with and without the C image encoder).
Both sides must give the same output or the same error; a difference raises, and libFuzzer saves
the input as crash-<sha1>. Lossless lines must also come back as the Entry they came from (law 1), and the entry API's dict
writer (`entry_to_blob`, C's Plan.messages) must give the Python path's messages; it and the C
Tuple path must leave CPython's one-character latin-1 strs as they were (no UTF-8 written into
them, issue 29 finding 7).
An input is read by its first byte:
  b"E" + an Entry's bytes       (the seeds: every Entry of tests/fuzz_seeds/*.pb and samples/*.pb)
  b"B" + Blob JSON lines         (the seeds: tests/fuzz_seeds/*.blob.jsonl)
  b"N" + an Entries' bytes       (the seeds: tests/fuzz_seeds/*.entries.bin): `entries_to_blob_lines`
                                 against protobuf's parse and the Python encoder, and C's
                                 `split_items` / `valid_entries` against protobuf's parse
  anything else                  structure-aware: atheris.FuzzedDataProvider picks an op, columns of
                                 the types DTS sends, and per value a dataType, charset, sv and bv
                                 from spellings that sit on the edges of what C takes; sometimes
                                 properties with keys of the reserved `datahub:` prefix (header,
                                 event, column, row), a non-DML Entry whose Event has the
                                 sub-message its messageType names, none, another or only
                                 properties, or an Entries of such Entries with fields spelt at
                                 the edges of what protobuf reads (overlong tags and lengths, tags
                                 above 2^32, field numbers 0 and 2^29, every wire type).
The seed corpus (E/B files) is written to build/fuzz-seeds on start and read after the corpus
dirs given. Coverage guidance covers the Python modules (instrumented on import); the C extension
is built by gcc, which has no libFuzzer coverage hooks, so C-side branches are found only through
the Python paths and the comparison (docs/decisions.md, "The Python <-> C contract").

Environment: BRIDGE_SPEEDUPS_SO=<path> loads that build of the extension (make sanitize's ASan
build) in place of the installed one; BRIDGE_FUZZ_PLANT=1 flips one bit of the C path's first
line, so a test can see that a difference is caught.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import sys

import atheris

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEED_DIR = os.path.join(ROOT, "build", "fuzz-seeds")
PLANT = os.environ.get("BRIDGE_FUZZ_PLANT", "") not in ("", "0")

if os.environ.get("BRIDGE_SPEEDUPS_SO"):  # before bridge is imported: the one build every path uses
    _spec = importlib.util.spec_from_file_location("bridge.native._speedups", os.environ["BRIDGE_SPEEDUPS_SO"])
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    sys.modules[_spec.name] = _module

sys.path.insert(0, ROOT)
from tests.support.wire_spec import varint  # noqa: E402  (the tests' own varint writer, not instrumented)

with atheris.instrument_imports(include=["bridge"]):
    import orjson

    import bridge
    from bridge import pb
    from bridge.errors import BridgeError
    from bridge.native import NATIVE, speedups
    from bridge.values import Inexact, codec_for

# Column types as DTS writes Column.originalType, with the DataTypes DTS sends their values in
_COLUMNS = [
    ("bigint(20)", [pb.INT64]), ("int(11)", [pb.INT32, pb.INT64]), ("tinyint(4)", [pb.INT8]),
    ("tinyint(1)", [pb.INT8]), ("smallint(6)", [pb.INT16]), ("bigint(20) unsigned", [pb.UINT64, pb.INT64]),
    ("int(10) unsigned", [pb.UINT32]), ("year(4)", [pb.INT16, pb.STRING]), ("bit(1)", [pb.INT64]),
    ("bit(8)", [pb.INT64]), ("bit(64)", [pb.INT64]), ("double", [pb.FLOAT64]), ("float", [pb.FLOAT32]),
    ("decimal(10,2)", [pb.DECIMAL]), ("decimal(65,30)", [pb.DECIMAL]), ("varchar(32)", [pb.STRING]),
    ("char(4)", [pb.STRING]), ("longtext", [pb.STRING]), ("enum('a','b')", [pb.STRING]),
    ("binary(4)", [pb.STRING, pb.BYTES]), ("varbinary(16)", [pb.BYTES]), ("blob", [pb.BYTES]),
    ("json", [pb.BYTES, pb.STRING]), ("date", [pb.STRING]), ("datetime", [pb.STRING]),
    ("datetime(3)", [pb.STRING]), ("datetime(6)", [pb.STRING]), ("timestamp", [pb.STRING]),
    ("timestamp(6)", [pb.STRING]), ("time", [pb.STRING]), ("time(3)", [pb.STRING]), ("geometry", [pb.BYTES]),
]
_CHARSETS = ["", "utf8mb4", "utf8", "UTF8MB4", "gbk", "latin1", "binary", "ascii", "utf16", "gb18030", "big5",
             "nonesuch"]
_SPELLINGS = ["", "0", "-0", "1", "-1", "007", "127", "128", "-129", "255", "65535", "2147483648", "4294967295",
              "9223372036854775807", "9223372036854775808", "-9223372036854775809", "18446744073709551615",
              "18446744073709551616", "+1", " 1", "1.0", "0.1", "1.5", "-0.0", "1e16", "1e-05", ".5", "1.",
              "5e-324", "1.7976931348623157e+308", "nan", "inf", "123456789012345.6", "0.30000000000000004",
              "2024-02-29", "2023-02-29", "0000-00-00", "0001-01-01", "9999-12-31", "2024-13-01",
              "2024-02-29 12:00:00", "2024-02-29 23:59:60", "1969-12-31 23:59:59", "2024-02-29 12:00:00.5",
              "2024-02-29 12:00:00.123", "2024-02-29 12:00:00.123456", "2024-02-29 12:00:00 +00:00",
              "2024-02-29 12:00:00.120 +00:00", "2024-02-29 12:00:00 +08:00", "0000-00-00 00:00:00",
              "12:34:56", "-838:59:59", "838:59:59.5", "true", "{}", '{"a": [1, "é"]}', "é", "北京", "\x00",
              "\ud7ff", "a\tb\"c\\d\n"]
_BYTES = [b"", b"x", b"\x00", b"\xff", b"\xc3\xa9", b"\xe5\x8c\x97\xe4\xba\xac", b"\xb1\xb1\xbe\xa9", b"\x80abc",
          b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x01\x00\x00\x00\x01\x01\x00\x00\x00",
          b"\xe9", b"\xa0", b"\x80", b"\xe9\xe8"]  # one latin-1 byte: CPython's one-character singleton str
# Properties: the reserved prefix the bridge writes its own facts under, on DTS input (issue 29, 1)
_PROPERTY_KEYS = ["subscribe_id", "k", "datahub:op", "datahub:eventTime", "datahub:sequenceId", "datahub:foo",
                  "datahub:", "datahub:shardKey", "DATAHUB:op"]
_PROPERTY_VALUES = ["v", "", "INSERT", "UPDATE", "DELETE", "UPDATE_BEFOR", "1700000000123", "42", "-1", "é"]
_NON_DML = [pb.BEGIN, pb.COMMIT, pb.DDL, pb.ROLLBACK, pb.HEARTBEAT, pb.CHECKPOINT]
_SUB_MESSAGE = {pb.BEGIN: "beginEvent", pb.COMMIT: "commitEvent", pb.DDL: "ddlEvent", pb.ROLLBACK: "rollbackEvent",
                pb.HEARTBEAT: "heartbeatEvent", pb.CHECKPOINT: "checkpointEvent", pb.DML: "dmlEvent"}


def _text(fdp: atheris.FuzzedDataProvider, pool: list):
    """A spelling from the pool (most of the time) or fresh fuzz bytes of the pool's kind."""
    if fdp.ConsumeIntInRange(0, 3) != 3:
        return pool[fdp.ConsumeIntInRange(0, len(pool) - 1)]
    return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 12)) if isinstance(pool[0], bytes) else \
        fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))


def _properties(fdp: atheris.FuzzedDataProvider, props) -> None:
    """One or two KVPairs, their keys often of the reserved `datahub:` prefix."""
    for _ in range(fdp.ConsumeIntInRange(1, 2)):
        props.add(key=fdp.PickValueInList(_PROPERTY_KEYS), value=fdp.PickValueInList(_PROPERTY_VALUES))


def _non_dml(fdp: atheris.FuzzedDataProvider, entry) -> None:
    """A non-DML Entry: its Event holds the sub-message its messageType names (with or without
    fields), none, only properties, or another's (issue 29, finding 5)."""
    mt = fdp.PickValueInList(_NON_DML)
    entry.header.messageType = mt
    event = entry.event
    shape = fdp.ConsumeIntInRange(0, 4)
    if shape in (0, 1):  # the sub-message, empty (1) or with fields
        sub = getattr(event, _SUB_MESSAGE[mt])
        sub.SetInParent()
        if shape == 0:
            if mt == pb.BEGIN:
                sub.transactionId, sub.threadId = fdp.PickValueInList(["", "tx-1", "é"]), fdp.ConsumeIntInRange(0, 9)
            elif mt == pb.COMMIT:
                sub.transactionId = fdp.PickValueInList(["", "tx-1"])
            elif mt == pb.DDL:
                sub.schemaName = fdp.PickValueInList(["", "db"])
                sub.sql = fdp.PickValueInList(["", "CREATE TABLE t (a int)", "DROP TABLE 表"])
                sub.executionTime = fdp.ConsumeIntInRange(0, 3)
            elif mt == pb.HEARTBEAT:
                sub.epoch = fdp.PickValueInList([0, 1700000000, -1])
            elif mt == pb.CHECKPOINT:
                sub.syncedGtid, sub.fakeGtid = fdp.PickValueInList(["", "g:1-5"]), fdp.ConsumeBool()
                sub.fileName, sub.position = fdp.PickValueInList(["", "binlog.000001"]), fdp.ConsumeIntInRange(0, 99)
    elif shape == 2:  # only properties
        _properties(fdp, event.properties)
    elif shape == 3:  # another type's sub-message
        getattr(event, _SUB_MESSAGE[fdp.PickValueInList([*_NON_DML, pb.DML])]).SetInParent()
    # shape 4: no Event content at all
    if fdp.ConsumeIntInRange(0, 3) == 3 and shape != 2:
        _properties(fdp, event.properties)


def _structured_entry(fdp: atheris.FuzzedDataProvider) -> bytes:
    """An Entry's bytes built from the input: header, DML type, 1..4 columns, 1..3 rows of values;
    sometimes a non-DML Entry instead."""
    entry = pb.Entry()
    header = entry.header
    header.messageType = pb.DML
    header.sourceType = fdp.PickValueInList([pb.MYSQL, pb.MYSQL, pb.MARIADB, 7])
    header.schemaName, header.tableName = "db", fdp.PickValueInList(["t", "t2", "表"])
    header.seqId = fdp.ConsumeIntInRange(0, 2**64 - 1) if fdp.ConsumeBool() else 1000
    header.timestamp = [1700000000, 1700000000, 1700000000, 0, 978307199, 2**32 - 1][fdp.ConsumeIntInRange(0, 5)]
    header.version = fdp.PickValueInList([1, 0, 2])
    if fdp.ConsumeIntInRange(0, 7) == 7:
        _properties(fdp, header.properties)
    if fdp.ConsumeIntInRange(0, 7) == 7:
        _non_dml(fdp, entry)
        return entry.SerializeToString()
    if fdp.ConsumeIntInRange(0, 15) == 15:
        _properties(fdp, entry.event.properties)
    dml = entry.event.dmlEvent
    dml.dmlEventType = fdp.PickValueInList([pb.INSERT, pb.UPDATE, pb.DELETE])
    columns = [_COLUMNS[fdp.ConsumeIntInRange(0, len(_COLUMNS) - 1)] for _ in range(fdp.ConsumeIntInRange(1, 4))]
    for index, (type_text, _) in enumerate(columns):
        name = {15: "c0", 14: "é", 13: "a b"}.get(fdp.ConsumeIntInRange(0, 15), f"c{index}")
        column = dml.columns.add(name=name, originalType=type_text, isKey=index == 0)
        if fdp.ConsumeIntInRange(0, 31) == 31:
            _properties(fdp, column.properties)
    images = {pb.INSERT: ("newColumns",), pb.UPDATE: ("oldColumns", "newColumns"), pb.DELETE: ("oldColumns",)}
    codecs = [_codec(type_text) for type_text, _ in columns]
    canonical = fdp.ConsumeIntInRange(0, 3) != 3  # most Entries: values as DTS spells them, which C takes
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        row = dml.rows.add()
        if fdp.ConsumeIntInRange(0, 15) == 15:
            _properties(fdp, row.properties)
        names = images[dml.dmlEventType]
        if fdp.ConsumeIntInRange(0, 15) == 15:  # an image the op must not carry, or one missing
            names = fdp.PickValueInList([("oldColumns", "newColumns"), (), ("newColumns",)])
        for name in names:
            datas = getattr(row, name)
            for (_, datatypes), codec in zip(columns[:len(columns) - (fdp.ConsumeIntInRange(0, 15) == 15)], codecs):
                data = datas.add()
                _value(fdp, data, datatypes)
                if canonical and fdp.ConsumeIntInRange(0, 31) != 31 and not _canonical(codec, data):
                    data.Clear()  # a value the codec reads nothing from: NIL, so the Entry stays one C takes
    if fdp.ConsumeIntInRange(0, 15) == 15:
        entry.header.ClearField("messageType")  # BEGIN with a dmlEvent: Python's to refuse
    return entry.SerializeToString()


def _value(fdp: atheris.FuzzedDataProvider, data, datatypes: list) -> None:
    roll = fdp.ConsumeIntInRange(0, 19)  # (an input run out gives 0s: the common case)
    if roll == 19:
        return  # NIL
    if roll == 18:
        data.dataType = pb.NA
        return
    data.dataType = datatypes[fdp.ConsumeIntInRange(0, len(datatypes) - 1)] if roll < 16 else \
        fdp.ConsumeIntInRange(0, 15)
    if fdp.ConsumeIntInRange(0, 3) == 3:
        data.charset = _text(fdp, _CHARSETS)
    if data.dataType == pb.BYTES or fdp.ConsumeIntInRange(0, 5) == 5:
        data.bv = _text(fdp, _BYTES) if fdp.ConsumeBool() else _text(fdp, _SPELLINGS).encode("utf-8", "replace")
    if data.dataType != pb.BYTES or fdp.ConsumeIntInRange(0, 5) == 5:
        spelt = _text(fdp, _SPELLINGS)
        if data.dataType == pb.STRING and not data.charset and fdp.ConsumeBool():
            data.bv = spelt.encode("utf-8", "replace")  # text and temporals travel in bv
        else:
            data.sv = spelt


_CODECS: dict = {}


def _codec(type_text: str):
    if type_text not in _CODECS:
        _CODECS[type_text] = codec_for(pb.Column(name="c", originalType=type_text))
    return _CODECS[type_text]


def _canonical(codec, data) -> bool:
    """The Data as the codec writes the value it reads from it (its canonical spelling: what DTS
    sends); False, the Data as it is, when the codec reads no value from it."""
    if data.dataType in (pb.NIL, pb.NA):
        return True
    try:
        value = codec.to_blob(data)
    except Inexact as exc:
        value = exc.best
    except (BridgeError, ValueError, TypeError, OverflowError, UnicodeError):
        return False
    if value is None:
        return False
    try:
        built = codec.from_blob(value, data.charset)
    except (BridgeError, ValueError, TypeError, OverflowError, UnicodeError, LookupError):
        return False
    data.CopyFrom(built)
    return True


# ---- the comparison ------------------------------------------------------------------------------

class Differ(AssertionError):
    """The C path and the Python path disagree."""


def _outcome(call):
    try:
        return call()
    except BridgeError as exc:
        return ("error", type(exc).__name__, str(exc))


def _same(what: str, c_path, python) -> None:
    if c_path != python:
        raise Differ(f"{what}: the C path gave {c_path!r:.600}, the Python path {python!r:.600}")


def _planted(lines, raw: bytes):
    """BRIDGE_FUZZ_PLANT: the first line of a DML Entry (the lines C writes) with one bit flipped."""
    if PLANT and isinstance(lines, list) and lines and pb.Entry.FromString(raw).header.messageType == pb.DML:
        first = bytearray(lines[0])
        first[0] ^= 1
        return [bytes(first), *lines[1:]]
    return lines


def check_entry(raw: bytes) -> None:
    """DTS -> Blob lines, DTS -> Tuple rows and (on the lines) Blob -> DTS, C on and off."""
    try:
        pb.Entry.FromString(raw)
    except Exception:  # noqa: BLE001 - bytes protobuf does not parse reach no converter (DecodeError)
        return
    for options in (bridge.DEFAULT_OPTIONS, bridge.Options(strict=True)):
        # first the C faces that make strs (before anything of this input asks a str for its UTF-8)
        api, native_tuples = c_strs(raw, options)
        python = _outcome(lambda: [orjson.dumps(m) for m in bridge.BlobEncoder(options).convert(pb.Entry.FromString(raw))])
        c_path = _planted(_outcome(lambda: bridge.BlobEncoder(options).convert_lines(pb.Entry.FromString(raw), raw)), raw)
        _same(f"DTS -> Blob lines ({'strict' if options.strict else 'lossless'})", c_path, python)
        tuples = _outcome(lambda: bridge.TupleEncoder(options, native=False).convert(pb.Entry.FromString(raw), raw))
        _same("DTS -> Tuple rows", native_tuples, tuples)
        _same("the entry API", api if isinstance(api, tuple) else [orjson.dumps(m) for m in api], python)
        if isinstance(python, list) and python:
            check_blob(python, options)
            if not options.strict:
                check_round_trip(raw, python, options)


# ---- CPython's one-character latin-1 strs (issue 29, finding 7) ---------------------------------

def _utf8_offset() -> int | None:
    """Where PyCompactUnicodeObject keeps its UTF-8 pointer on this CPython (3.11, 3.12), checked
    against PyUnicode_AsUTF8 on a str of our own; None elsewhere (the check is then off)."""
    if platform.python_implementation() != "CPython" or sys.version_info[:2] not in ((3, 11), (3, 12)):
        return None
    offset = 56 if sys.version_info[:2] == (3, 11) else 48
    probe = "".join(["caf", "\xe9", "!"])
    as_utf8 = ctypes.pythonapi.PyUnicode_AsUTF8
    as_utf8.restype, as_utf8.argtypes = ctypes.c_void_p, [ctypes.py_object]
    if ctypes.c_void_p.from_address(id(probe) + offset).value is not None:
        return None
    pointer = as_utf8(probe)
    return offset if ctypes.c_void_p.from_address(id(probe) + offset).value == pointer else None


_UTF8_OFFSET = _utf8_offset()


def _latin1_caches() -> list:
    """The UTF-8 pointer of each of CPython's one-character latin-1 strs (U+0080..U+00FF)."""
    if _UTF8_OFFSET is None:
        return []
    return [ctypes.c_void_p.from_address(id(chr(c)) + _UTF8_OFFSET).value for c in range(0x80, 0x100)]


def c_strs(raw: bytes, options) -> tuple:
    """The entry API (`entry_to_blob`: C's dict writer, Plan.messages) and the C Tuple path
    (Plan.tuples), which make strs: their outcomes, after checking that they wrote no UTF-8 into a
    str they did not make (CPython's one-character latin-1 strs that had none have none after).
    A singleton CPython has filled itself (orjson asked it for its UTF-8 on an earlier input) is no
    longer seen: each is watched until its first use."""
    before = _latin1_caches()
    api = _outcome(lambda: bridge.entry_to_blob(pb.Entry.FromString(raw), options))
    tuples = _outcome(lambda: bridge.TupleEncoder(options, native=True).convert(pb.Entry.FromString(raw), raw))
    after = _latin1_caches()
    written = [chr(0x80 + i) for i, (b, a) in enumerate(zip(before, after)) if b is None and a is not None]
    if written:
        raise Differ(f"the C path wrote a UTF-8 form into CPython's one-character str(s) {written!r}")
    return api, tuples


def check_round_trip(raw: bytes, lines: list, options) -> None:
    """Law 1: lossless lines come back, through `feed_line` (the Python image encoder), as the
    Entry they came from, byte for byte as protobuf writes it (issue 29: reserved-prefix
    properties and non-DML Entries without their sub-message broke it)."""
    decoder = bridge.BlobDecoder(options)
    decoder._native = False
    back = _outcome(lambda: [e.SerializeToString(deterministic=True) for line in lines
                             for e in decoder.feed_line(line)] + [str(e) for e in decoder.finish()])
    entry = pb.Entry.FromString(raw)
    if back != [entry.SerializeToString(deterministic=True)]:
        raise Differ(f"DTS -> Blob -> DTS (lossless): {entry!r:.600} came back as "
                     f"{back if isinstance(back, tuple) else [pb.Entry.FromString(b) for b in back[:3]]!r:.600}")


# ---- Entries bytes (issue 29, finding 6) ----------------------------------------------------------

def _protobuf_parses(data: bytes, message) -> bool:
    try:
        message.FromString(data)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError (or RuntimeError on depth)
        return False
    return True


def _meets_group(data: bytes) -> bool:
    """Does a top-level field of the bytes, read by upb's rules up to the first thing it refuses,
    start a group (protobuf skips it; C leaves the Entries to protobuf)?"""
    p = 0

    def varint(limit: int):
        nonlocal p
        value = 0
        for i in range(limit):
            if p + i >= len(data):
                return None
            value |= (data[p + i] & 0x7F) << (7 * i)
            if not data[p + i] & 0x80:
                p += i + 1
                return value
        return None

    while p < len(data):
        tag = varint(5)
        if tag is None or tag > 0xFFFFFFFF or tag >> 3 == 0 or tag & 7 in (4, 6, 7):
            return False
        wt = tag & 7
        if wt == 3:
            return True
        if wt == 0 and varint(10) is None:
            return False
        if wt in (1, 5):
            p += 8 if wt == 1 else 4
        if wt == 2:
            size = varint(5)
            if size is None:
                return False
            p += size
    return False


def check_split(data: bytes) -> list | None:
    """C's split_items and valid_entries against protobuf's parse of the Entries: items only
    where protobuf parses the framing, then exactly its items; None wherever protobuf refuses (or
    where a group, which protobuf skips, makes C leave it to protobuf); valid_entries never True
    where protobuf refuses. The items protobuf parses, or None."""
    ok = _protobuf_parses(data, pb.Entries)
    raws = speedups.split_items(data)
    if speedups.valid_entries(data) and not ok:
        raise Differ(f"valid_entries vouches for bytes protobuf refuses: {data[:200].hex()}")
    if raws is None:
        if ok and not _meets_group(data):
            raise Differ(f"split_items refuses an Entries protobuf parses: {data[:200].hex()}")
    else:
        items_ok = all(_protobuf_parses(raw, pb.Entry) for raw in raws)
        if ok != items_ok:
            raise Differ(f"split_items gave items of an Entries protobuf {'parses' if ok else 'refuses'}, "
                         f"its items {'do' if items_ok else 'do not'} parse: {data[:200].hex()}")
        if ok and [pb.Entry.FromString(raw) for raw in raws] != list(pb.Entries.FromString(data).items):
            raise Differ(f"split_items gave other items than protobuf's: {data[:200].hex()}")
    return [item.SerializeToString() for item in pb.Entries.FromString(data).items] if ok else None


def _class(result):
    return result[:2] if isinstance(result, tuple) else result


def check_entries(data: bytes) -> None:
    """An Entries' bytes: split_items as protobuf parses (check_split); `entries_to_blob_lines`
    (C) against the Python path (protobuf's parse of the whole, a DecodeError if it refuses, then
    the Python encoder): the same lines, or an error of the same class; then each Entry as check_entry."""
    items = check_split(data)
    for options in (bridge.DEFAULT_OPTIONS, bridge.Options(strict=True)):
        if items is None:
            python = ("error", "DecodeError")
        else:
            encoder = bridge.BlobEncoder(options)
            python = _outcome(lambda: [orjson.dumps(m) for raw in items for m in encoder.convert(pb.Entry.FromString(raw))])
        c_path = _outcome(lambda: bridge.entries_to_blob_lines(data, options))
        _same(f"entries_to_blob_lines ({'strict' if options.strict else 'lossless'})", _class(c_path), _class(python))
    for raw in items or ():
        check_entry(raw)


_EDGE_FIELDS = [0, 1, 1, 1, 2, 15, (1 << 29) - 1, 1 << 29, (1 << 32) + 1, (1 << 32) + 2]


def _edge_field(fdp: atheris.FuzzedDataProvider, entries: list) -> bytes:
    """A field of an Entries at the edges of what protobuf reads: field number (0, 1, unknown,
    2^29 - 1, 2^29, above 2^32), any wire type, the tag overlong or with bits above 2^32 a 32-bit
    cast drops, and a payload that fits the wire type or is cut, overlong or of another length."""
    field, wt = fdp.PickValueInList(_EDGE_FIELDS), fdp.ConsumeIntInRange(0, 7)
    value = field << 3 | wt
    spelling = fdp.ConsumeIntInRange(0, 3)
    if spelling == 2:
        tag = varint(value, max(len(varint(value)), fdp.ConsumeIntInRange(1, 11)))
    elif spelling == 3:
        tag = varint(value | fdp.PickValueInList([1 << 32, 1 << 35, 1 << 40, 1 << 63]))
    else:
        tag = varint(value)
    if wt == 0:
        payload = varint(fdp.ConsumeIntInRange(0, 2**64 - 1), fdp.PickValueInList([None, 10, 11]))
    elif wt in (1, 5):
        payload = b"\x00" * fdp.PickValueInList([8 if wt == 1 else 4, 3])
    elif wt == 2:
        body = fdp.PickValueInList(entries) if fdp.ConsumeBool() else fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 12))
        size = len(varint(len(body)))
        payload = varint(len(body) + fdp.PickValueInList([0, 0, 0, 1, -1]),
                          fdp.PickValueInList([size, size, 5, 6, 10])) + body
    elif wt == 3:
        payload = fdp.PickValueInList([varint(field << 3 | 4), b"", varint((field + 1) << 3 | 4)])
    else:
        payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 2))
    return tag + payload


def _structured_entries(fdp: atheris.FuzzedDataProvider) -> bytes:
    """An Entries of 1..3 structured Entries, some items' tag or length spelt at an edge, and
    edge fields among them."""
    entries = [_structured_entry(fdp) for _ in range(fdp.ConsumeIntInRange(1, 3))]
    parts = []
    for raw in entries:
        if fdp.ConsumeIntInRange(0, 3) == 3:
            parts.append(_edge_field(fdp, entries))
        roll = fdp.ConsumeIntInRange(0, 3)
        if roll == 3:  # the item's own tag or length at an edge
            tag = fdp.PickValueInList([varint(10, 5), varint(10, 6), varint(10 | 1 << 32), varint(10 | 1 << 35),
                                       varint(18 | 1 << 35), varint(2)])
            parts.append(tag + varint(len(raw), fdp.PickValueInList([None, 5, 6])) + raw)
        else:
            parts.append(b"\x0a" + varint(len(raw)) + raw)
    if fdp.ConsumeIntInRange(0, 3) == 3:
        parts.append(_edge_field(fdp, entries))
    return b"".join(parts)


def check_blob(lines: list, options=bridge.DEFAULT_OPTIONS) -> None:
    """Blob -> DTS (`feed_line`, as the stream layer and Spark call it) with the C image encoder and
    without it: line by line the same Entries or the same error, then the same end-of-input reports."""
    outcomes = []
    for native in (True, False):
        decoder = bridge.BlobDecoder(options)
        decoder._native = native
        got = [_outcome(lambda line=line: [e.SerializeToString() for e in decoder.feed_line(line)]) for line in lines]
        got.append([(type(e).__name__, str(e)) for e in decoder.finish()])
        outcomes.append(got)
    _same("Blob -> DTS", *outcomes)


def check_blob_lines(data: bytes) -> None:
    lines = [line for line in data.splitlines() if line.strip()][:50]
    for options in (bridge.DEFAULT_OPTIONS, bridge.Options(strict=True)):
        check_blob(lines, options)


def test_one_input(data: bytes) -> None:
    if data[:1] == b"E":
        check_entry(data[1:])
    elif data[:1] == b"B":
        check_blob_lines(data[1:])
    elif data[:1] == b"N":
        check_entries(data[1:])
    else:
        fdp = atheris.FuzzedDataProvider(data)
        if fdp.ConsumeIntInRange(0, 7) == 7:
            check_entries(_structured_entries(fdp))
        else:
            check_entry(_structured_entry(fdp))


# ---- the seed corpus -------------------------------------------------------------------------------

_SEED_ENTRIES, _SEED_ROWS = 8, 5  # per file, per Entry: the seeds repeat their shapes past these


def write_seeds(dest: str = SEED_DIR) -> str:
    """The Entries of tests/fuzz_seeds/*.pb and samples/*.pb (the first _SEED_ENTRIES of a file, rows
    cut to _SEED_ROWS) as b"E" inputs, each tests/fuzz_seeds/*.blob.jsonl as a b"B" input, each
    tests/fuzz_seeds/*.entries.bin as a b"N" input and each
    tests/fuzz_seeds/fuzz-* (an input this target once failed on) as it is, into
    `dest`, whose other files go (it is derived; each file is replaced whole, so runs side by side
    read whole files)."""
    from bridge.stream import ErrorPolicy, dts_records_to_entries
    os.makedirs(dest, exist_ok=True)
    seeds: dict[str, bytes] = {}
    sources = [(d, n) for d in (os.path.join(ROOT, "tests", "fuzz_seeds"), os.path.join(ROOT, "samples"))
               if os.path.isdir(d) for n in sorted(os.listdir(d))]
    for folder, name in sources:
        path = os.path.join(folder, name)
        if name.startswith("fuzz-"):  # an input this target once failed on, as libFuzzer saved it
            with open(path, "rb") as fh:
                seeds[name] = fh.read()
        elif name.endswith(".blob.jsonl"):
            with open(path, "rb") as fh:
                seeds[name] = b"B" + fh.read()
        elif name.endswith(".entries.bin"):  # an Entries' bytes as they are (malformed ones too)
            with open(path, "rb") as fh:
                seeds[name] = b"N" + fh.read()
        elif name.endswith(".pb"):
            records = [(0, number, value) for number, _, value in bridge.read_pb(path)]
            found = dts_records_to_entries(records, ErrorPolicy("skip"), raw=True)
            for index, (_, entry, raw) in enumerate(found):
                if index >= _SEED_ENTRIES:
                    break
                if len(entry.event.dmlEvent.rows) > _SEED_ROWS:
                    del entry.event.dmlEvent.rows[_SEED_ROWS:]
                    raw = entry.SerializeToString()
                seeds[f"{name}.{index}"] = b"E" + raw
    for name in set(os.listdir(dest)) - set(seeds):
        os.remove(os.path.join(dest, name))
    for name, data in seeds.items():
        path = os.path.join(dest, name)
        if os.path.exists(path):
            with open(path, "rb") as fh:
                if fh.read() == data:
                    continue
        with open(f"{path}.{os.getpid()}", "wb") as fh:
            fh.write(data)
        os.replace(f"{path}.{os.getpid()}", path)
    return dest


def main() -> None:
    if not NATIVE:
        sys.exit("fuzz_native: the C extension is not loaded (BRIDGE_PURE_PYTHON, or no build): nothing to compare")
    argv = list(sys.argv)
    dirs = [a for a in argv[1:] if not a.startswith("-")]
    if dirs:  # read after the dirs given; libFuzzer writes new inputs into the first one only
        argv.append(write_seeds())
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
