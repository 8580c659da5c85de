"""Temporal policies (docs/cli.md, "Temporal policies") and the laws on samples/realistic.

`Options.zero_dates` (null | error | string) and `Options.temporal_precision` (truncate | round |
exact) act on Tuple rows and strict Blob; lossless Blob keeps every value as sent. Every value a
policy substitutes is counted (Tally.zero_dates, Tally.fractions) and handed to the loss ledger,
once, whichever path (C or Python) converted the Entry.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bridge
from bridge import pb
from bridge.errors import ConversionError, TupleFormatError
from bridge.options import Options
from bridge.stream import ErrorPolicy, counted, dts_records_to_entries, entries_to_messages
from bridge.tuple import TupleEncoder, record_schema, tuples_to_entries
from bridge.values import SUBSTITUTION_NOTES
from bridge.wire.framing import read_pb
from support.native_paths import assert_same
from support.strategies import data_for
from support.strict_form import strict_normal_form, through_json
from support.tuple_form import holdable, rewritten, tuple_normal_form

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
ZERO_DATES = ("null", "error", "string")
PRECISIONS = ("truncate", "round", "exact")
POLICIES = [Options(strict=strict, zero_dates=z, temporal_precision=p)
            for strict in (False, True) for z in ZERO_DATES for p in PRECISIONS]
POLICY_IDS = [f"{'strict' if o.strict else 'lossless'}-{o.zero_dates}-{o.temporal_precision}" for o in POLICIES]

TYPES = ["date", "datetime", "datetime(3)", "datetime(6)", "timestamp", "timestamp(6)"]
# (type, text) pairs the policies act on, and neighbours they must leave alone
VALUES = {
    "date": ["0000-00-00", "2020-00-15", "2021-02-30", "2024-02-29", "1970-01-01"],
    "datetime": ["0000-00-00 00:00:00", "2021-02-30 10:00:00", "2021-05-17 07:22:42"],
    "datetime(3)": ["0000-00-00 00:00:00.000", "2021-05-17 07:22:42.123"],
    "datetime(6)": ["0000-00-00 00:00:00.000000", "2021-05-17 07:22:42.123456", "2021-05-17 07:22:42.123500",
                    "2021-05-17 07:22:42.999999", "2021-12-31 23:59:59.999500", "2021-05-17 07:22:42.123000",
                    "1969-12-31 23:59:59.000001"],
    "timestamp": ["0000-00-00 00:00:00 +00:00", "2021-05-17 07:22:42 +00:00"],
    "timestamp(6)": ["0000-00-00 00:00:00.000000 +00:00", "2021-05-17 07:22:42.000500 +00:00",
                     "2021-05-17 07:22:42.000499 +00:00", "2021-05-17 07:22:42.250000 +00:00"],
}
CHARSETS = ("", "utf8mb4", "binary")


def temporal_entry(type_text: str, texts: list[str], charset: str = "", seq: int = 41, nulls: bool = False) -> pb.Entry:
    e = pb.Entry(header=pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1621236162,
                                  seqId=seq, schemaName="shop", tableName="t"))
    dml = e.event.dmlEvent
    dml.dmlEventType = pb.INSERT
    dml.columns.add(name="id", originalType="int(11)", isKey=True)
    dml.columns.add(name="c", originalType=type_text)
    for i, text in enumerate(texts):
        value = pb.Data(dataType=pb.STRING, charset=charset, bv=text.encode())
        dml.rows.add(newColumns=[pb.Data(dataType=pb.INT32, sv=str(i + 1)), pb.Data() if nulls and i % 2 else value])
    return e


def run_entries(entries, convert, options=None) -> tuple[list, ErrorPolicy, list]:
    """(outputs, policy, ledger) of a stream of Entries (or (Entry, raw) pairs) under skip."""
    ledger: list = []
    policy = ErrorPolicy("skip", ledger=ledger.append)
    items = [({"line": n}, *(e if isinstance(e, tuple) else (e,))) for n, e in enumerate(entries, 1)]
    out = [item for _, item in entries_to_messages(items, convert, policy)]
    return out, policy, ledger


# ---- the C path gives way wherever a policy acts ----------------------------------------------------

# Faces of the Blob encoder: name -> (encoder -> converter, whether it takes the Entry's bytes)
FACES = {
    "convert (Python)": (lambda enc: lambda e: [orjson.dumps(m) for m in enc.convert(e)], False),
    "convert (wire)": (lambda enc: lambda e, r: [orjson.dumps(m) for m in enc.convert(e, r)], True),
    "convert_lines": (lambda enc: enc.convert_lines, True),
    "convert_columns": (lambda enc: lambda e, r: list(enc.convert_columns(e, r)[-1]), True),
    "stream_lines": (lambda enc: lambda e, r: list(enc.stream_lines(e, r)), True),
}


# lossless mode ignores the policies (tested below): two of its combinations are enough here
C_POLICIES = [o for o in POLICIES if o.strict] + [Options(), Options(zero_dates="string", temporal_precision="exact")]


@pytest.mark.parametrize("options", C_POLICIES, ids=lambda o: f"{'strict' if o.strict else 'lossless'}-"
                                                              f"{o.zero_dates}-{o.temporal_precision}")
def test_c_and_python_paths_agree_on_zero_dates_and_fractions(options):
    """Every face of the Blob encoder gives the same lines, errors, counts and ledger for every
    temporal value, charset and policy: where C took a value a policy acts on, its ledger line
    would be missing (the policies live in Python only)."""
    for type_text, charset in itertools.product(TYPES, CHARSETS):
        several = [temporal_entry(type_text, VALUES[type_text], charset, nulls=nulls) for nulls in (False, True)]
        singles = [temporal_entry(type_text, [text], charset) for text in VALUES[type_text]]
        for one in several + singles:
            raw = one.SerializeToString()
            assert_same(raw, options)
            results = {}
            for face, (make, wire) in FACES.items():
                item = (pb.Entry.FromString(raw), raw) if wire else pb.Entry.FromString(raw)
                got, policy, ledger = run_entries([item], make(bridge.BlobEncoder(options)))
                results[face] = (got, policy.tally, ledger, [r["reason"] for r in policy.rejects])
            first = results["convert (Python)"]
            assert all(r == first for r in results.values()), (type_text, charset, one)


# the calendar's ends, a DST gap (America/New_York) and a zero date, per type
EDGES = {"date": ["0001-01-01", "9999-12-31", "0000-00-00"],
         "datetime": ["0001-01-01 00:00:00", "9999-12-31 23:59:59", "2021-03-14 02:30:00", "2021-02-30 10:00:00"],
         "datetime(6)": ["9999-12-31 23:59:59.999999", "0001-01-01 00:00:00.000001"],
         "timestamp": ["9999-12-31 23:59:59 +00:00", "0000-00-00 00:00:00 +00:00"]}


@pytest.mark.parametrize("timezone", ["Asia/Shanghai", "America/New_York"])
def test_c_and_python_paths_agree_in_other_time_zones_and_at_the_calendar_ends(timezone):
    for options in (Options(strict=True, timezone=timezone), Options(strict=True, timezone=timezone,
                                                                      zero_dates="error", temporal_precision="exact"),
                    Options(timezone=timezone)):
        for type_text, text in ((t, v) for t, texts in EDGES.items() for v in texts):
            raw = temporal_entry(type_text, [text], "utf8mb4" if type_text == "date" else "").SerializeToString()
            results = []
            for make, wire in FACES.values():
                item = (pb.Entry.FromString(raw), raw) if wire else pb.Entry.FromString(raw)
                got, policy, ledger = run_entries([item], make(bridge.BlobEncoder(options)))
                results.append((got, policy.tally, ledger, [r["reason"] for r in policy.rejects]))
            assert all(r == results[0] for r in results), (timezone, options, type_text, text)


# ---- strict Blob -----------------------------------------------------------------------------------

@pytest.mark.parametrize("type_text, text", [(t, v) for t in TYPES for v in VALUES[t] if v.startswith("0000")]
                         + [("date", "2020-00-15"), ("date", "2021-02-30"), ("datetime", "2021-02-30 10:00:00")])
def test_strict_zero_dates_follow_the_policy(type_text, text):
    entry = temporal_entry(type_text, [text])
    [null], policy, ledger = run_entries([entry], bridge.BlobEncoder(Options(strict=True)).convert)
    assert null["payload"]["after"]["dataColumn"]["c"] is None and "dts" not in null
    assert policy.tally.zero_dates == 1 and ledger == [
        {"line": 1, "column": "c", "kind": "zero_dates", "value": text, "written": None}]
    with pytest.raises(ConversionError, match="zero or invalid date") as info:
        bridge.entry_to_blob(entry, Options(strict=True, zero_dates="error"))
    assert info.value.where["column"] == "c" and info.value.where["seq_id"] == 41
    [as_text] = bridge.entry_to_blob(entry, Options(strict=True, zero_dates="string"))
    assert as_text["schema"]["dataColumn"][1] == {"name": "c", "type": "STRING"}
    assert as_text["payload"]["after"]["dataColumn"]["c"] == text
    [back] = bridge.blob_to_entries(through_json([as_text]), Options(strict=True, zero_dates="string"))
    assert back.event.dmlEvent.rows[0].newColumns[1].bv == text.encode()


@pytest.mark.parametrize("text, truncated, rounded", [
    ("2021-05-17 07:22:42.123456", 1621236162123, 1621236162123),
    ("2021-05-17 07:22:42.123500", 1621236162123, 1621236162124),
    ("2021-12-31 23:59:59.999500", 1640995199999, 1640995200000),  # rounding carries into the next day
    ("1969-12-31 23:59:59.000001", -1000, -1000),
])
def test_strict_sub_millisecond_digits_follow_the_policy(text, truncated, rounded):
    entry = temporal_entry("datetime(6)", [text])
    for precision, ms in (("truncate", truncated), ("round", rounded)):
        [msg], policy, ledger = run_entries([entry], bridge.BlobEncoder(Options(strict=True,
                                                                               temporal_precision=precision)).convert)
        assert msg["payload"]["after"]["dataColumn"]["c"] == ms
        assert (policy.tally.fractions, ledger[0]["written"], ledger[0]["value"]) == (1, ms, text)
    with pytest.raises(ConversionError, match="sub-millisecond"):
        bridge.entry_to_blob(entry, Options(strict=True, temporal_precision="exact"))


def test_a_rejected_entry_counts_no_substitution():
    """An Entry converts whole or not at all: its substitutions count only when it converts."""
    entry = temporal_entry("datetime(6)", ["2021-05-17 07:22:42.123456", "0000-00-00 00:00:00.000000"])
    _, policy, ledger = run_entries([entry], bridge.BlobEncoder(Options(strict=True, zero_dates="error")).convert)
    assert (policy.tally.rejected, policy.tally.fractions, ledger) == (1, 0, [])
    _, policy, ledger = run_entries([entry], bridge.BlobEncoder(Options(strict=True)).convert)
    assert (policy.tally.zero_dates, policy.tally.fractions, len(ledger)) == (1, 1, 2)
    assert "1 zero or invalid dates written as null; 1 sub-millisecond fractions" in policy.tally.summary()


# ---- lossless Blob keeps every value as sent ------------------------------------------------------

def sample_entries(name: str) -> list[pb.Entry]:
    records = ((0, number, raw) for number, _, raw in read_pb(SAMPLES / f"{name}.pb"))
    return [entry for _, entry in dts_records_to_entries(records, ErrorPolicy("fail"))]


def test_lossless_blob_ignores_the_temporal_policies_and_round_trips_realistic():
    entries = sample_entries("realistic")
    expected = [bridge.encode_blob(m) for e in entries for m in bridge.entry_to_blob(e)]
    for options in POLICIES[:len(POLICIES) // 2]:  # the lossless ones
        got, policy, ledger = run_entries(entries, bridge.BlobEncoder(options).convert_lines)
        assert got == expected and not ledger
        assert (policy.tally.zero_dates, policy.tally.fractions) == (0, 0)
    zero = [line for line in expected if b'"0000-00-00' not in line and b"MDAwMC0wMC0w" in line]
    assert zero  # zero dates travel as their raw Data (base64 of "0000-00-0...")
    # law 1: DTS -> Blob -> DTS gives the same Entries; law 2: those Blob messages come back equal
    messages = [orjson.loads(line) for line in expected]
    back = list(bridge.blob_to_entries(messages))
    assert [e.SerializeToString() for e in back] == [e.SerializeToString() for e in entries]
    assert through_json(m for e in back for m in bridge.entry_to_blob(e)) == messages
    for msg in messages:  # law 5
        bridge.validate_blob(msg)


@settings(max_examples=60)
@given(st.sampled_from(TYPES).flatmap(lambda t: st.tuples(st.just(t), data_for(t, nullable=False, absent=False))),
       st.sampled_from(POLICIES[:len(POLICIES) // 2]))
def test_lossless_blob_keeps_generated_temporals_as_sent(case, options):
    type_text, data = case
    entry = temporal_entry(type_text, [data.bv.decode()])
    assert list(bridge.blob_to_entries(through_json(bridge.entry_to_blob(entry, options)), options)) == [entry]


# ---- the strict law with the default policies -------------------------------------------------

def _default_policies(family: str, d: pb.Data) -> None:
    if family in ("date", "datetime", "timestamp") and d.dataType == pb.STRING:
        text = d.bv.decode()
        if text.startswith("0000-00-00"):
            d.Clear()
        elif "." in text[19:26]:
            head, _, rest = text.partition(".")
            digits, _, zone = rest.partition(" ")
            d.bv = f"{head}.{digits[:3].ljust(len(digits), '0')}{' ' + zone if zone else ''}".encode()


def policy_applied(entry: pb.Entry) -> pb.Entry:
    """The Entry as the default policies see it: zero dates NULL, digits below the millisecond zero."""
    return rewritten(entry, _default_policies)


def test_strict_law_with_the_default_policies_holds_on_realistic():
    """DTS -> strict Blob (null, truncate) -> DTS equals law 4's normal form of the Entry with zero
    dates as NULL and sub-millisecond digits dropped; nothing is rejected, everything is counted."""
    entries = sample_entries("realistic")
    strict = Options(strict=True)
    _, policy, ledger = run_entries(entries, bridge.BlobEncoder(strict).convert)
    assert policy.tally.rejected == 0 and policy.tally.zero_dates and policy.tally.fractions
    assert len(ledger) == policy.tally.zero_dates + policy.tally.fractions
    for entry in entries:
        messages = bridge.entry_to_blob(entry, strict)
        expected = strict_normal_form(policy_applied(entry))
        assert expected is not None
        assert list(bridge.blob_to_entries(through_json(messages), strict)) == expected
        for msg in messages:
            bridge.validate_blob(msg)


# ---- Tuple ---------------------------------------------------------------------------------------

def _tuple_spelling(family: str, d: pb.Data) -> None:
    if family in ("date", "datetime", "timestamp"):
        d.ClearField("charset")
    elif family == "double" and d.sv:
        d.sv = repr(float(d.sv))


def canonical_values(entry: pb.Entry) -> pb.Entry:
    """What a Tuple row keeps of realistic's non-canonical spellings (docs/tuple.md): no charset on
    temporal text, a double's shortest repr ("1" comes back "1.0")."""
    return rewritten(entry, _tuple_spelling)


def test_tuple_law_holds_on_realistic():
    """DTS -> Tuple -> DTS gives the normal form of docs/tuple.md, zero dates coming back as NIL."""
    entries = sample_entries("realistic")
    for options in (Options(), Options(strict=True, source_table=True)):
        encoder = TupleEncoder(options)
        for entry in entries:
            rows = encoder.convert(entry)
            columns = list(entry.event.dmlEvent.columns)
            table = None if options.source_table else (entry.header.schemaName, entry.header.tableName)
            back = list(tuples_to_entries(rows, record_schema(columns, options), options, table=table,
                                          columns=columns))
            assert back == tuple_normal_form(holdable(canonical_values(entry)), options, by_source=options.source_table)


def test_tuple_string_mode_gives_the_text_back():
    entry = temporal_entry("datetime(6)", ["0000-00-00 00:00:00.000000", "2021-05-17 07:22:42.123456"])
    options = Options(zero_dates="string")
    rows = bridge.entry_to_tuples(entry, options)
    assert [r["c"] for r in rows] == ["0000-00-00 00:00:00.000000", "2021-05-17 07:22:42.123456"]
    columns = list(entry.event.dmlEvent.columns)
    schema = record_schema(columns, options)
    assert schema["fields"][1] == {"name": "c", "type": "STRING"}
    back = list(tuples_to_entries(rows, schema, options, table="shop.t", columns=columns))
    assert [e.event.dmlEvent.rows[0].newColumns[1] for e in back] == \
        [pb.Data(dataType=pb.STRING, bv=text.encode()) for text in (r["c"] for r in rows)]
    # read back without the option, the STRING field does not fit the datetime column: the error says why
    with pytest.raises(TupleFormatError, match='zero_dates="string"') as info:
        list(tuples_to_entries(rows, schema, table="shop.t", columns=columns))
    assert info.value.where["column"] == "c"


def test_tuple_null_from_a_zero_date_comes_back_as_nil():
    entry = temporal_entry("date", ["0000-00-00"])
    rows, policy, ledger = run_entries([entry], TupleEncoder().convert)
    assert rows[0]["c"] is None and policy.tally.zero_dates == 1 and ledger[0]["column"] == "c"
    columns = list(entry.event.dmlEvent.columns)
    [back] = tuples_to_entries(rows, record_schema(columns), table="shop.t", columns=columns)
    assert back.event.dmlEvent.rows[0].newColumns[1] == pb.Data(dataType=pb.NIL)


def test_counted_keeps_notes_only_of_a_record_that_converted():
    policy = ErrorPolicy("skip")

    def failing(entry):
        bridge.entry_to_tuples(entry)
        raise ConversionError("later defect")

    entry = temporal_entry("date", ["0000-00-00"])
    with pytest.raises(ConversionError):
        counted(policy, {"line": 1}, failing, entry)
    assert policy.tally.zero_dates == 0
    counted(policy, {"line": 1}, TupleEncoder().convert, entry)
    assert policy.tally.zero_dates == 1 and SUBSTITUTION_NOTES.notes is None


def test_an_entry_sync_dead_letters_counts_no_substitution():
    """sync's gate (--on-table-error dlq) turns a failed conversion into a dead letter, an output of
    its own: the zero date the conversion wrote as NULL before it failed counts nowhere."""
    from bridge.stream import Tally, entries_to_outputs
    from bridge.sync import EntryGate, TableErrors

    def failing(entry):
        TupleEncoder().convert(entry)
        raise ConversionError("later defect")

    entry = temporal_entry("date", ["0000-00-00"])
    gate = EntryGate(failing, list, None, TableErrors("dlq", None, "test", Tally()))
    ledger: list = []
    policy = ErrorPolicy("skip", ledger=ledger.append)
    [(_, failed)] = entries_to_outputs([({"partition": 0, "offset": 0, "entry": 0}, entry)], gate, policy,
                                       size=lambda out: 1)
    assert type(failed).__name__ == "_Failed" and (policy.tally.zero_dates, ledger) == (0, [])
    gate.convert = TupleEncoder().convert  # the same Entry converted: counted
    list(entries_to_outputs([({"partition": 0, "offset": 0, "entry": 0}, entry)], gate, policy, size=len))
    assert policy.tally.zero_dates == len(ledger) == 1


def test_an_entry_streamed_in_pieces_counts_each_substitution_once():
    """stream_lines converts a large Entry twice (a first pass for errors, then piece by piece as the
    writer takes the lines): its substitutions are counted once, those of the second pass dropped."""
    texts = [f"2021-05-17 07:22:{i % 60:02d}.{i:06d}" for i in range(1, 120)]
    entries = [temporal_entry("datetime(6)", texts, seq=41), temporal_entry("datetime(6)", texts[:3], seq=42)]
    encoder = bridge.BlobEncoder(Options(strict=True), line_budget=4096)
    streamed = encoder.stream_lines(entries[0])
    assert not isinstance(streamed, list)  # the Entry is converted in pieces
    lines, policy, ledger = run_entries(entries, encoder.stream_lines)
    assert len(lines) == 122 and all(b'"c":1621236' in line for line in lines)
    assert policy.tally.fractions == len(ledger) == 122
    assert [r["line"] for r in ledger] == [1] * 119 + [2] * 3


# ---- dates MySQL takes beyond what the target holds ------------------------------------------------

@pytest.mark.parametrize("type_text, text", [("datetime", "9999-12-31 23:59:59"),
                                             ("datetime(6)", "9999-12-31 23:59:59.999999"),
                                             ("timestamp", "9999-12-31 23:59:59 +00:00"),
                                             ("date", "9999-12-31")])
def test_tuple_dates_beyond_the_timestamp_range_follow_zero_dates(type_text, text):
    """MySQL's `9999-12-31 23:59:59` ("valid until") lies past DataHub's TIMESTAMP range (it ends at
    9999-12-31 15:59:59 UTC): null writes NULL, counted as out_of_range and in the ledger; error
    names the position; string writes the text. `9999-12-31` (a DATE) fits: left alone."""
    entry = temporal_entry(type_text, [text])
    fits = type_text == "date"
    [row], policy, ledger = run_entries([entry], TupleEncoder().convert)
    if fits:
        assert isinstance(row["c"], int) and not ledger and policy.tally.out_of_range == 0
        return
    assert row["c"] is None and (policy.tally.out_of_range, policy.tally.zero_dates) == (1, 0)
    assert ledger == [{"line": 1, "column": "c", "kind": "out_of_range", "value": text, "written": None}]
    assert "1 dates beyond DataHub's TIMESTAMP range written as null" in policy.tally.summary()
    columns = list(entry.event.dmlEvent.columns)
    [back] = tuples_to_entries([row], record_schema(columns), table="shop.t", columns=columns)
    assert back.event.dmlEvent.rows[0].newColumns[1] == pb.Data(dataType=pb.NIL)
    with pytest.raises(ConversionError, match="TIMESTAMP range") as info:
        bridge.entry_to_tuples(entry, Options(zero_dates="error"))
    assert info.value.where == {"seq_id": 41, "table": "shop.t", "column": "c"} and info.value.value == text
    [as_text] = bridge.entry_to_tuples(entry, Options(zero_dates="string"))
    assert as_text["c"] == text


@pytest.mark.parametrize("timezone, type_text, text", [
    ("Asia/Shanghai", "datetime", "0001-01-01 00:00:00"),  # the instant is in year 0 UTC
    ("Asia/Shanghai", "date", "0001-01-01"),
    ("Asia/Shanghai", "datetime(6)", "0001-01-01 00:00:00.000001"),
    ("America/New_York", "datetime", "9999-12-31 23:59:59"),  # the instant is in year 10000 UTC
    ("America/New_York", "date", "9999-12-31"),
])
def test_first_and_last_days_convert_in_any_time_zone(timezone, type_text, text):
    """A wall-clock time MySQL takes whose instant falls outside years 1..9999 UTC converts and
    comes back as sent (strict Blob named it a DST gap, Tuple failed without naming a column)."""
    entry = temporal_entry(type_text, [text])
    for precision in ("exact",) if "." not in text else ("truncate",):
        strict = Options(strict=True, timezone=timezone, zero_dates="error", temporal_precision=precision)
        messages = bridge.entry_to_blob(entry, strict)
        [back] = bridge.blob_to_entries(through_json(messages), strict)
        # strict Blob -> DTS writes the foreign type of DATE (datetime(3)): the wall clock, to the second
        assert back.event.dmlEvent.rows[0].newColumns[1].bv.decode().startswith(text[:19])
    options = Options(timezone=timezone)
    [row], policy, ledger = run_entries([entry], TupleEncoder(options).convert)
    if text.startswith("9999-12-31 23"):  # past DataHub's TIMESTAMP range in any zone west of UTC+8
        assert row["c"] is None and policy.tally.out_of_range == 1
        return
    assert isinstance(row["c"], int) and not ledger
    columns = list(entry.event.dmlEvent.columns)
    [back] = tuples_to_entries([row], record_schema(columns, options), options, table="shop.t", columns=columns)
    assert back.event.dmlEvent.rows[0].newColumns[1].bv == text.encode()
