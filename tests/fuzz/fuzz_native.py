"""Coverage-guided fuzzing of the C fast path against the pure-Python path (atheris).

    .venv/bin/python tests/fuzz/fuzz_native.py [libFuzzer flags] [corpus dirs]   (make fuzz)

Each input becomes one DTS Entry (or Blob lines) and goes through every face twice, with the C
path on and off: DTS -> Blob lines (`BlobEncoder.convert_lines(entry, raw)` against the Python
path's lines), DTS -> Tuple rows (`TupleEncoder(native=True)` against `native=False`) and, on the
Blob messages that came out, Blob -> DTS (`BlobDecoder` with and without the C image encoder).
Both sides must give the same output or the same error; a difference raises, and libFuzzer saves
the input as crash-<sha1>. An input is read by its first byte:
  b"E" + an Entry's bytes       (the seeds: every Entry of tests/fuzz_seeds/*.pb and samples/*.pb)
  b"B" + Blob JSON lines         (the seeds: tests/fuzz_seeds/*.blob.jsonl)
  anything else                  structure-aware: atheris.FuzzedDataProvider picks an op, columns of
                                 the types DTS sends, and per value a dataType, charset, sv and bv
                                 from spellings that sit on the edges of what C takes.
The seed corpus (E/B files) is written to build/fuzz-seeds on start and read after the corpus
dirs given. Coverage guidance covers the Python modules (instrumented on import); the C extension
is built by gcc, which has no libFuzzer coverage hooks, so C-side branches are found only through
the Python paths and the comparison (docs/decisions.md, "The Python <-> C contract").

Environment: BRIDGE_SPEEDUPS_SO=<path> loads that build of the extension (make sanitize's ASan
build) in place of the installed one; BRIDGE_FUZZ_PLANT=1 flips one bit of the C path's first
line, so a test can see that a difference is caught.
"""
from __future__ import annotations

import importlib.util
import os
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
with atheris.instrument_imports(include=["bridge"]):
    import orjson

    import bridge
    from bridge import pb
    from bridge.errors import BridgeError
    from bridge.native import NATIVE
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
          b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x01\x00\x00\x00\x01\x01\x00\x00\x00"]


def _text(fdp: atheris.FuzzedDataProvider, pool: list):
    """A spelling from the pool (most of the time) or fresh fuzz bytes of the pool's kind."""
    if fdp.ConsumeIntInRange(0, 3) != 3:
        return pool[fdp.ConsumeIntInRange(0, len(pool) - 1)]
    return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 12)) if isinstance(pool[0], bytes) else \
        fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))


def _structured(data: bytes) -> bytes:
    """An Entry's bytes built from the input: header, DML type, 1..4 columns, 1..3 rows of values."""
    fdp = atheris.FuzzedDataProvider(data)
    entry = pb.Entry()
    header = entry.header
    header.messageType = pb.DML
    header.sourceType = fdp.PickValueInList([pb.MYSQL, pb.MYSQL, pb.MARIADB, 7])
    header.schemaName, header.tableName = "db", fdp.PickValueInList(["t", "t2", "表"])
    header.seqId = fdp.ConsumeIntInRange(0, 2**64 - 1) if fdp.ConsumeBool() else 1000
    header.timestamp = [1700000000, 1700000000, 1700000000, 0, 978307199, 2**32 - 1][fdp.ConsumeIntInRange(0, 5)]
    header.version = fdp.PickValueInList([1, 0, 2])
    if fdp.ConsumeIntInRange(0, 7) == 7:
        header.properties.add(key=fdp.PickValueInList(["subscribe_id", "datahub:op", "k"]), value="v")
    dml = entry.event.dmlEvent
    dml.dmlEventType = fdp.PickValueInList([pb.INSERT, pb.UPDATE, pb.DELETE])
    columns = [_COLUMNS[fdp.ConsumeIntInRange(0, len(_COLUMNS) - 1)] for _ in range(fdp.ConsumeIntInRange(1, 4))]
    for index, (type_text, _) in enumerate(columns):
        name = {15: "c0", 14: "é", 13: "a b"}.get(fdp.ConsumeIntInRange(0, 15), f"c{index}")
        dml.columns.add(name=name, originalType=type_text, isKey=index == 0)
    images = {pb.INSERT: ("newColumns",), pb.UPDATE: ("oldColumns", "newColumns"), pb.DELETE: ("oldColumns",)}
    codecs = [_codec(type_text) for type_text, _ in columns]
    canonical = fdp.ConsumeIntInRange(0, 3) != 3  # most Entries: values as DTS spells them, which C takes
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        row = dml.rows.add()
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
        python = _outcome(lambda: [orjson.dumps(m) for m in bridge.BlobEncoder(options).convert(pb.Entry.FromString(raw))])
        c_path = _planted(_outcome(lambda: bridge.BlobEncoder(options).convert_lines(pb.Entry.FromString(raw), raw)), raw)
        _same(f"DTS -> Blob lines ({'strict' if options.strict else 'lossless'})", c_path, python)
        tuples = [_outcome(lambda native=native: bridge.TupleEncoder(options, native=native).convert(
            pb.Entry.FromString(raw), raw)) for native in (True, False)]
        _same("DTS -> Tuple rows", *tuples)
        if isinstance(python, list) and python:
            check_blob(python, options)


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
    else:
        check_entry(_structured(data))


# ---- the seed corpus -------------------------------------------------------------------------------

_SEED_ENTRIES, _SEED_ROWS = 8, 5  # per file, per Entry: the seeds repeat their shapes past these


def write_seeds(dest: str = SEED_DIR) -> str:
    """The Entries of tests/fuzz_seeds/*.pb and samples/*.pb (the first _SEED_ENTRIES of a file, rows
    cut to _SEED_ROWS) as b"E" inputs, each tests/fuzz_seeds/*.blob.jsonl as a b"B" input and each
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
