"""Issue 29 (hostile input, round 2), findings 2, 3 and the Python half of 6: memory that grew with the
rows of one Entry, and an error class that depended on the C extension.

2. DTS -> Tuple streams the rows of a large Entry (`TupleEncoder.stream`, the CLI's `convert`,
   `entries_to_tuples`): the same rows, errors, counts and substitutions as `convert`, C and Python,
   in any piece size; the issue's 115 KB input converts in flat memory.
3. `stream_blob_lines` gives the library's lines one by one; `entries_to_blob_lines`, its list,
   refuses past `max_bytes` with OutputTooLargeError: under an address-space limit the issue's 75 KB
   input ends in that error, never in a signal.
6. Bytes of one Entries that protobuf does not parse are a DecodeError for the whole Entries on both
   paths, whichever Entry before them fails to convert (C used to give the first Entry's
   ConversionError), and whatever C's own split makes of them (tags past 32 bits, overlong tags,
   field numbers protobuf refuses).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import orjson
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import bridge
import bridge.blob.lines as blob_lines
import bridge.tuple.encode as tuple_encode
from bridge import pb
from bridge.cli import main as cli
from bridge.native import NATIVE
from bridge.samples import build_sample_entries
from bridge.tuple.files import tuple_converter
from bridge.values import SUBSTITUTION_NOTES
from support.native_paths import assert_outcomes, outcome
from support.strategies import dml_entries, entries

OPTIONS = [bridge.DEFAULT_OPTIONS, bridge.Options(strict=True), bridge.Options(zero_dates="string"),
           bridge.Options(tuple_binary="hex", source_table=True), bridge.Options(timezone="Asia/Shanghai")]
OPTION_IDS = ["default", "strict", "zero-dates-string", "hex-source-table", "shanghai"]
T0 = 1605339932


def _wide_entry(columns: int, rows: int, seq: int = 1) -> pb.Entry:
    """The issue's amplifier: one INSERT, many int(11) columns, rows without Data."""
    e = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=T0,
                                  schemaName="db", tableName="wide", seqId=seq))
    dml_event = e.event.dmlEvent
    for i in range(columns):
        dml_event.columns.add(name=f"c{i}", originalType="int(11)")
    for _ in range(rows):
        dml_event.rows.add()
    return e


def _peak_of(argv: list[str], env: dict | None = None) -> tuple[int, int, str]:
    """(exit status, peak RSS in KiB, stderr) of a command run by a fresh interpreter, which reads
    its child's peak from getrusage(RUSAGE_CHILDREN)."""
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stderr=subprocess.PIPE, text=True); "
            "sys.stderr.write(r.stderr); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True, env=env)
    status, peak_kib = map(int, done.stdout.split())
    return status, peak_kib, done.stderr


# ---- finding 2: DTS -> Tuple streams ------------------------------------------------------------

@contextlib.contextmanager
def _pieces_of(cells: int):
    """TupleEncoder.stream's pieces of about `cells` values (a row at least)."""
    saved = tuple_encode._PIECE_CELLS
    tuple_encode._PIECE_CELLS = cells
    try:
        yield
    finally:
        tuple_encode._PIECE_CELLS = saved


def _noted(call):
    """(outcome of call(), the substitutions it noted)."""
    notes = []
    SUBSTITUTION_NOTES.notes = notes
    try:
        return outcome(call), notes
    finally:
        SUBSTITUTION_NOTES.notes = None


def _counts(encoder) -> tuple:
    return encoder.entries, encoder.emitted, dict(encoder.not_emitted)


def _streamed(encoder, entry, raw) -> list:
    """stream()'s rows taken whole; a second iteration of a streamed result gives them again."""
    out = encoder.stream(entry, raw)
    rows = list(out)
    assert len(out) == len(rows)
    if not isinstance(out, list):
        assert list(out) == rows
    return rows


@st.composite
def _many_row_entries(draw) -> pb.Entry:
    """A DML Entry of 1..4 drawn rows repeated up to 6 times, sometimes spoilt in a late row: an
    image the op must not carry, or a DataType no converter knows."""
    entry = draw(dml_entries())
    dml_event = entry.event.dmlEvent
    rows = list(dml_event.rows)
    for _ in range(draw(st.integers(0, 5))):
        dml_event.rows.extend(rows)
    spoil = draw(st.sampled_from(["none", "none", "image", "datatype"]))
    last = dml_event.rows[len(dml_event.rows) - 1]
    if spoil == "image" and dml_event.dmlEventType in (pb.INSERT, pb.DELETE):
        wrong = last.oldColumns if dml_event.dmlEventType == pb.INSERT else last.newColumns
        wrong.add(dataType=pb.INT64, sv="1")
    elif spoil == "datatype":
        image = last.newColumns or last.oldColumns
        if len(image):
            image[len(image) - 1].dataType = 99
    return entry


@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@given(entry=_many_row_entries(), cells=st.sampled_from([1, 7, 64]), with_raw=st.booleans())
def test_tuple_stream_gives_convert_s_rows_errors_counts_and_notes(entry, options, cells, with_raw):
    """Finding 2: every DML Entry streamed (cell_budget 0) in pieces of a row or more gives what
    `convert` gives, C (with and without the Entry's bytes) and Python alike."""
    raw = entry.SerializeToString() if with_raw else None
    expected_encoder = bridge.TupleEncoder(options, native=False)
    expected = _noted(lambda: expected_encoder.convert(entry))
    for native in (True, False):
        whole = bridge.TupleEncoder(options, native=native)
        assert_outcomes(_noted(lambda: whole.convert(entry, raw)), expected, f"convert native={native}")
        with _pieces_of(cells):
            encoder = bridge.TupleEncoder(options, native=native, cell_budget=0)
            got = _noted(lambda: _streamed(encoder, entry, raw))
        assert_outcomes(got, expected, f"stream native={native}")
        assert _counts(encoder) == _counts(expected_encoder)


@pytest.mark.skipif(not NATIVE, reason="C extension switched off (BRIDGE_PURE_PYTHON)")
def test_a_streamed_tuple_entry_s_pieces_are_c_s():
    """The pieces of a plain Entry come from the C plan (an Entry holding only their rows), none
    from Python, and their sequence ids count on from the piece's first row."""
    e = _wide_entry(3, 50, seq=5)
    for i, row in enumerate(e.event.dmlEvent.rows):
        row.newColumns.extend([pb.Data(dataType=pb.INT64, sv=str(i + k)) for k in range(3)])
    encoder = bridge.TupleEncoder(cell_budget=0)
    python_rows = encoder._python_rows
    taken = []
    encoder._python_rows = lambda *args: taken.append(args[-2:]) or python_rows(*args)
    with _pieces_of(16):  # 2 rows (8 values each) a piece
        rows = _streamed(encoder, e, None)
    assert taken == []
    assert rows == bridge.TupleEncoder(native=False).convert(e)
    assert [r["_sequence_id_"] for r in rows[48:]] == ["5000048", "5000049"] and rows[49]["c2"] == 51


def test_small_entries_are_not_streamed_and_large_ones_are_counted_once():
    encoder = bridge.TupleEncoder()
    small = _wide_entry(4, 3)
    assert isinstance(encoder.stream(small), list)
    large = _wide_entry(2000, 600)  # 600 x 2,005 values: past the 1M of CELL_BUDGET
    out = encoder.stream(large)
    assert not isinstance(out, list) and len(out) == 600
    assert _counts(encoder) == (2, 603, {})
    assert sum(1 for _ in out) == 600 and _counts(encoder) == (2, 603, {})  # taking them counts nothing


def test_entries_to_tuples_and_the_cli_s_converter_stream():
    """`entries_to_tuples` and `tuple_converter(stream=True)` give the rows of `convert`, a large
    Entry's as a sized iterable the CLI takes one by one; `stream=False` (sync, kafka) a list."""
    entries = [_wide_entry(3, 2), _wide_entry(600, 2000, seq=2), _wide_entry(3, 1, seq=3)]
    expected = [row for e in entries for row in bridge.TupleEncoder(native=False).convert(e)]
    rows = bridge.entries_to_tuples(iter(entries))
    assert next(rows) == expected[0]
    assert [expected[0], *rows] == expected
    listed, streamed = tuple_converter(bridge.Options(), None), tuple_converter(bridge.Options(), None, stream=True)
    big = streamed(entries[1])
    assert not isinstance(big, list) and len(big) == 2000
    assert list(big) == listed(entries[1]) and isinstance(listed(entries[1]), list)
    assert streamed(entries[0]) == listed(entries[0])
    assert tuple_converter(bridge.Options(), "db.other", stream=True)(entries[1]) == []


def _tuple_cli_peak(tmp_path, rows: int) -> int:
    src = tmp_path / "wide.pb"
    with open(src, "wb") as fh:
        cli.write_pb(fh, cli.pack_entries([_wide_entry(2000, rows)]))
    assert rows != 40_000 or 110_000 < src.stat().st_size < 120_000  # the issue's 115 KB
    out = tmp_path / "wide.jsonl"
    status, peak_kib, stderr = _peak_of([sys.executable, "-m", "bridge", "convert", str(src), "-o", str(out),
                                         "--to", "tuple", "--no-progress"])
    assert status == 0, stderr
    assert f"wrote {rows} to 1 file" in stderr
    with open(out, "rb") as fh:
        first = orjson.loads(fh.readline())
        count = 1 + sum(1 for _ in fh)
    assert count == rows and len(first) == 2005 and first["c1999"] is None
    assert first["_sequence_id_"] == "1000000"
    return peak_kib


def test_convert_to_tuple_streams_an_entry_s_rows_in_flat_memory(tmp_path):
    """Finding 2, a fifth of the issue's input (2,000 int columns, 8,000 rows without Data, 200 MB
    of rows): held at once it peaked near 450 MB; streamed, near 45 MB."""
    peak_kib = _tuple_cli_peak(tmp_path, 8000)
    assert peak_kib < 150 * 1024, f"peak RSS {peak_kib // 1024} MiB"


@pytest.mark.deep
def test_convert_to_tuple_of_the_issue_s_115_kb_input_stays_under_300_mb(tmp_path):
    """Finding 2 as measured: 40,000 rows, 1.0 GB of output, 2.07 GB peak before; now ~45 MB."""
    peak_kib = _tuple_cli_peak(tmp_path, 40_000)
    assert peak_kib < 300 * 1024, f"peak RSS {peak_kib // 1024} MiB"


# ---- finding 3: the library's Blob lines ---------------------------------------------------------

@contextlib.contextmanager
def _line_budget(options, budget: int):
    """The shared encoder of the batch forms with another line_budget (0: every DML Entry streamed)."""
    encoder = blob_lines._encoder(options)
    saved = encoder.line_budget
    encoder.line_budget = budget
    try:
        yield
    finally:
        encoder.line_budget = saved


def _entries_bytes(raws: list[bytes]) -> bytes:
    return b"".join(b"\x0a" + _varint(len(raw)) + raw for raw in raws)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


@pytest.mark.parametrize("budget", [64 << 20, 0], ids=["held", "streamed"])
@pytest.mark.parametrize("name", sorted(build_sample_entries()))
def test_stream_blob_lines_gives_the_list_form_s_lines(name, budget):
    entries = build_sample_entries()[name]
    options = bridge.Options()
    expected = [bridge.encode_blob(m) for e in entries for m in bridge.entry_to_blob(e, options)]
    raws = [e.SerializeToString() for e in entries]
    with _line_budget(options, budget):
        for given_as in (_entries_bytes(raws), raws):
            stream = bridge.stream_blob_lines(given_as, options)
            assert not isinstance(stream, list)
            assert list(stream) == expected
            assert bridge.entries_to_blob_lines(given_as, options) == expected
            total = sum(map(len, expected))
            assert bridge.entries_to_blob_lines(given_as, options, max_bytes=total) == expected


@pytest.mark.parametrize("budget", [64 << 20, 0], ids=["held", "streamed"])
def test_the_list_form_refuses_output_past_max_bytes_naming_the_entry(budget):
    entries = [_wide_entry(3, 2, seq=1), _wide_entry(3, 5, seq=2), _wide_entry(3, 1, seq=3)]
    options = bridge.Options()
    sizes = [sum(map(len, bridge.BlobEncoder(options).convert_lines(e))) for e in entries]
    data = pb.Entries(items=entries).SerializeToString()
    with _line_budget(options, budget):
        assert len(bridge.entries_to_blob_lines(data, options, max_bytes=sum(sizes))) == 8
        with pytest.raises(bridge.OutputTooLargeError) as caught:
            bridge.entries_to_blob_lines(data, options, max_bytes=sizes[0] + sizes[1] - 1)
    err = caught.value
    assert isinstance(err, bridge.ConversionError)
    assert err.where == {"entry": 1, "seq_id": 2, "table": "db.wide"}
    assert f"past max_bytes ({sizes[0] + sizes[1] - 1})" in str(err) and "stream_blob_lines" in str(err)
    for bad in (-1, True, 1.5, None):
        with pytest.raises(TypeError):
            bridge.entries_to_blob_lines(data, options, max_bytes=bad)


def test_the_batch_forms_locate_an_entry_s_error():
    bad = _wide_entry(2, 1, seq=4)
    bad.event.dmlEvent.dmlEventType = 7
    data = pb.Entries(items=[_wide_entry(2, 1), bad]).SerializeToString()
    for convert in (bridge.entries_to_blob_lines, lambda d: list(bridge.stream_blob_lines(d))):
        with pytest.raises(bridge.ConversionError) as caught:
            convert(data)
        assert caught.value.where["entry"] == 1 and caught.value.where["seq_id"] == 4


_LIMITED = """
import resource, sys
limit = int(sys.argv[2]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import bridge
data = open(sys.argv[1], "rb").read()
if sys.argv[3] == "list":
    try:
        bridge.entries_to_blob_lines(data)
    except bridge.BridgeError as err:
        print(type(err).__name__, err.where.get("entry"))
else:
    count = size = 0
    for line in bridge.stream_blob_lines(data):
        count += 1
        size += len(line)
    print(count, size)
"""


def _limited(tmp_path, entry: pb.Entry, limit_mib: int, form: str) -> str:
    src = tmp_path / "entries.pb"
    src.write_bytes(pb.Entries(items=[entry]).SerializeToString())
    done = subprocess.run([sys.executable, "-c", _LIMITED, str(src), str(limit_mib), form],
                          capture_output=True, text=True)
    assert done.returncode == 0, f"exit {done.returncode} (a negative one is a signal): {done.stderr[-2000:]}"
    return done.stdout.strip()


def test_the_list_form_under_an_address_space_limit_refuses_cleanly(tmp_path):
    """Finding 3 as measured: the issue's 75 KB Entries (2,000 int columns, 20,000 empty rows,
    1.6 GB of lines) under a 3 GB address-space limit died of SIGSEGV in orjson.dumps; the list
    form now stops at max_bytes (256 MiB) with OutputTooLargeError."""
    entry = _wide_entry(2000, 20_000)
    assert len(pb.Entries(items=[entry]).SerializeToString()) < 76_000
    assert _limited(tmp_path, entry, 3 << 10, "list") == "OutputTooLargeError 0"


def test_the_stream_form_under_an_address_space_limit_gives_every_line(tmp_path):
    """The streaming form of a smaller Entry (4,000 rows, 325 MB of lines) under 1.5 GB: every
    line, one Entry's line_budget held at most."""
    count, size = map(int, _limited(tmp_path, _wide_entry(2000, 4000), 1536, "stream").split())
    assert count == 4000 and size > 300_000_000


@pytest.mark.deep
def test_the_stream_form_of_the_issue_s_75_kb_input_under_3_gb(tmp_path):
    count, size = map(int, _limited(tmp_path, _wide_entry(2000, 20_000), 3 << 10, "stream").split())
    assert count == 20_000 and size > 1_500_000_000


# ---- finding 6: one error class for malformed Entries bytes --------------------------------------

def _failing_entries() -> list[pb.Entry]:
    """DML Entries that parse but do not convert (ConversionError on both paths)."""
    unknown_type = _wide_entry(2, 1)
    unknown_type.event.dmlEvent.dmlEventType = 7
    bad_value = _wide_entry(2, 1)
    bad_value.event.dmlEvent.rows[0].newColumns.extend([pb.Data(dataType=99, sv="1"), pb.Data(dataType=pb.NIL)])
    wrong_image = _wide_entry(1, 1)
    wrong_image.event.dmlEvent.rows[0].oldColumns.add(dataType=pb.INT64, sv="1")
    return [unknown_type, bad_value, wrong_image]


def _tag(field: int, wire_type: int, extra_bits: int = 0) -> bytes:
    return _varint((field << 3 | wire_type) | extra_bits)


# Entries bytes protobuf refuses after a first Entry (each appended to `_entries_bytes([first])`)
HOSTILE_TAILS = {
    "truncated item": b"\x0a\x05\x01",
    "item that is not an Entry": _entries_bytes([b"\x0a\x05\x01"]),
    "tag past 32 bits landing on items": _tag(1, 2, 1 << 32) + b"\x00",
    "tag past 32 bits landing on field 2": _tag(2, 2, 1 << 35) + b"\x00",
    "overlong 6-byte tag of items": b"\x8a\x80\x80\x80\x80\x00\x00",
    "field number 2^29": _tag(1 << 29, 0) + b"\x00",
}


@pytest.mark.parametrize("tail", sorted(HOSTILE_TAILS))
@pytest.mark.parametrize("first", ["good", "unknown DMLType", "bad value", "before image"])
def test_malformed_entries_bytes_are_a_decode_error_whichever_entry_comes_first(first, tail):
    entry = ({"good": _wide_entry(2, 0)} | dict(zip(["unknown DMLType", "bad value", "before image"],
                                                    _failing_entries())))[first]
    data = _entries_bytes([entry.SerializeToString()]) + HOSTILE_TAILS[tail]
    with pytest.raises(Exception):  # noqa: B017 - the reference: protobuf refuses the whole Entries
        pb.Entries.FromString(data)
    with pytest.raises(bridge.DecodeError, match="do not parse as subscribe.Entries"):
        bridge.entries_to_blob_lines(data)
    stream = bridge.stream_blob_lines(data)
    with pytest.raises(bridge.DecodeError, match="do not parse as subscribe.Entries"):
        next(stream)


@st.composite
def _corrupted_entries(draw) -> tuple[bytes, int]:
    """(Entries bytes, index of the corrupt item): random Entries, some failing to convert, and a
    later item cut short or spoilt so that it does not parse as an Entry."""
    items = [e.SerializeToString() for e in draw(st.lists(entries(), min_size=0, max_size=3))]
    failing = _failing_entries()
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), draw(st.sampled_from(failing)).SerializeToString())
    victim = draw(st.sampled_from(items + [b"\x0a\x02\x08\x01" + bytes(8)]))
    cut = draw(st.integers(1, max(1, len(victim) - 1)))
    corrupt = victim[:cut] if draw(st.booleans()) else victim[:cut] + bytes([draw(st.sampled_from([0x07, 0xFF]))])
    try:
        pb.Entry.FromString(corrupt)
        parses = True
    except Exception:  # noqa: BLE001 - protobuf's DecodeError (or a RuntimeError of upb)
        parses = False
    assume(not parses)  # still an Entry: not the case under test
    at = draw(st.integers(1, len(items) + 1)) if items else 0
    items.insert(min(at, len(items)), corrupt)
    return _entries_bytes(items), at


@given(case=_corrupted_entries())
def test_a_corrupt_later_item_is_a_decode_error_for_the_whole_entries(case):
    """Finding 6 (hypothesis): whatever the items before the corrupt one give (lines or a
    ConversionError), the Entries is a DecodeError, on the C path as on the Python one."""
    data, _ = case
    assert_outcomes(outcome(lambda: bridge.entries_to_blob_lines(data))[:2], ("error", "DecodeError"),
                    "entries_to_blob_lines")
    assert_outcomes(outcome(lambda: next(bridge.stream_blob_lines(data)))[:2], ("error", "DecodeError"),
                    "stream_blob_lines")


_OUTCOMES = """
import sys, bridge
from support.native_paths import outcome
for data in map(bytes.fromhex, sys.stdin.read().split()):
    print(repr(outcome(lambda: bridge.entries_to_blob_lines(data))))
"""


def test_c_and_pure_python_agree_on_malformed_entries_bytes():
    """Finding 6 across interpreters: each hostile Entries, with the C extension and under
    BRIDGE_PURE_PYTHON=1, gives the same outcome (error class and text, or lines)."""
    firsts = [_wide_entry(2, 0), *_failing_entries()]
    cases = [_entries_bytes([f.SerializeToString()]) + tail for f in firsts for tail in HOSTILE_TAILS.values()]
    cases += [_entries_bytes([f.SerializeToString() for f in firsts])]  # well-formed: the first ConversionError
    tests = os.path.dirname(os.path.abspath(__file__))
    got = {}
    for flag in ("", "1"):
        env = {**os.environ, "BRIDGE_PURE_PYTHON": flag, "PYTHONPATH": os.pathsep.join(
            [tests, *filter(None, [os.environ.get("PYTHONPATH")])])}
        done = subprocess.run([sys.executable, "-c", _OUTCOMES], input=" ".join(c.hex() for c in cases),
                              capture_output=True, text=True, env=env, check=True)
        got[flag] = done.stdout.splitlines()
    assert len(got[""]) == len(cases)
    assert got[""] == got["1"]
    assert all("'DecodeError'" in line for line in got[""][:-1])
    assert "'ConversionError'" in got[""][-1]
