"""The Spark Tuple job's compiled value tests (bridge/spark/to_datahub.py, `_compile_sure`): an
Entry's rows the tests are sure of skip the field checks' calls, and must come out exactly as the
checks give them (`_DtsToTuple._values`, FIELD_CHECKS and `_fit_decimal`): the same values of the
same types, and the same error where a check raises. No pyspark needed: the job runs on records.
"""
from __future__ import annotations

import math
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bridge
from bridge import pb
from bridge.spark.to_datahub import _DtsToTuple, _FromDts, _tuple_fields
from bridge.tuple import TIMESTAMP_RANGE, record_schema
from bridge.tuple.encode import INT_RANGES
from support.native_paths import assert_outcomes, outcome
from support.strategies import dml_entries, mysql_columns

TABLE = "shop.orders"


class Text(str):
    pass


class Whole(int):
    pass


def _typed(rows) -> list:
    return [[(type(v).__name__, repr(v)) for v in row] for row in rows]


class _PythonPath(_DtsToTuple):
    """The job without its C sink: every Entry through `convert` and the compiled tests (the sink is
    compared with this in tests/test_spark_tuple_sink.py)."""

    use_sink = False


def _job(fields, mode: str = "PERMISSIVE", positions: bool = False) -> _DtsToTuple:
    return _PythonPath(bridge.DEFAULT_OPTIONS, mode, TABLE, fields, positions)


class _Reference(_PythonPath):
    """The job as it was before its rows were held as rows: every value through the checks
    (`_values`), each Entry's values extended into the output columns (`_FromDts`)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.sure = lambda rows: None

    # how _FromDts holds its output: as columns, extended per Entry
    _reset, _held_rows, _take, _outputs = _FromDts._reset, _FromDts._held_rows, _FromDts._take, _FromDts._outputs
    _add, _add_rows, _error_row = _FromDts._add, _FromDts._add_rows, _FromDts._error_row

    def convert_columns(self, entry, raw=None):
        rows = self.convert(entry, raw)
        return len(rows), (list(zip(*rows)) if rows else [()] * self.nvalues)

    def chunks(self, records):
        for columns in _FromDts.chunks(self, records):
            yield columns if self.positions else columns[5:]


def _checked(job: _DtsToTuple, rows: list) -> list:
    """What the job gives for an Entry's rows: its compiled tests, else the checks."""
    job._rows = lambda entry, raw=None: rows
    return job.convert(None)


def _spark_kinds(ftype: str) -> st.SearchStrategy[str]:
    if ftype == "DECIMAL":
        return st.one_of(st.builds(lambda p, s: f"decimal({p},{min(s, p)})", st.integers(1, 38), st.integers(0, 12)),
                         st.just("decimal(20,0)"), st.just("decimal(38,18)"))
    plain = {"BIGINT": "bigint", "INTEGER": "int", "SMALLINT": "smallint", "TINYINT": "tinyint", "DOUBLE": "double",
             "FLOAT": "float", "BOOLEAN": "boolean", "TIMESTAMP": "timestamp", "STRING": "string"}[ftype]
    return st.just(plain)


_FTYPES = ("BIGINT", "INTEGER", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT", "DECIMAL", "BOOLEAN", "TIMESTAMP", "STRING")


def _edge_ints(ftype: str) -> st.SearchStrategy:
    lo, hi = INT_RANGES[ftype]
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, lo - 1, hi + 1, 0, -1, 2**64, -(2**70)]))


def _decimals() -> st.SearchStrategy:
    texts = st.sampled_from(["0", "0.00", "-0.00", "1.5", "1.50", "1.500", "-12.34", "1E+2", "1E-30", "NaN", "-NaN",
                             "sNaN", "Infinity", "-Infinity", "9999999999.99", "99999999999.99", "12345678901234567890",
                             "123456789012345678901", "0.000000000000000001", "1" * 38, "1" * 39])
    return st.one_of(texts.map(Decimal),
                     st.decimals(allow_nan=True, allow_infinity=True),
                     st.builds(lambda k, s: Decimal(k).scaleb(-s), st.integers(-10**40, 10**40), st.integers(-5, 25)))


def _values(ftype: str) -> st.SearchStrategy:
    """Values a row might hold in a field of this type: its own, near its edges, of other types."""
    if ftype in INT_RANGES:
        own = _edge_ints(ftype)
    elif ftype in ("DOUBLE", "FLOAT"):
        own = st.one_of(st.floats(), st.sampled_from([0.0, -0.0, 1e300, -1e300, 3.4e38, 3.5e38, 0.1, math.inf,
                                                       -math.inf, math.nan, 1.0000001]), st.integers(-5, 5))
    elif ftype == "DECIMAL":
        own = _decimals()
    elif ftype == "BOOLEAN":
        own = st.booleans()
    else:
        own = st.text(max_size=5)
    wrong = st.sampled_from([True, False, 1, 1.5, "1", b"x", [1], Text("t"), Whole(3), Decimal("2"), None])
    return st.one_of(st.none(), own, own, own, own, wrong)


@st.composite
def _tables(draw):
    """(fields, rows): (name, field type, Spark type) of up to 6 fields, and rows mostly holding
    each field's own values, some a value of another type, a missing field or one not in the schema."""
    ftypes = draw(st.lists(st.sampled_from(_FTYPES), min_size=1, max_size=6))
    fields = [(f"f{i}", ftype, draw(_spark_kinds(ftype))) for i, ftype in enumerate(ftypes)]
    rows = []
    for _ in range(draw(st.integers(0, 4))):
        row = {name: draw(_values(ftype)) for name, ftype, _ in fields}
        if draw(st.integers(0, 9)) == 0:
            del row[draw(st.sampled_from(sorted(row)))]
        if draw(st.integers(0, 19)) == 0:
            row["extra"] = 1
        rows.append(row)
    return fields, rows


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(table=_tables())
def test_compiled_tests_give_what_the_checks_give(table):
    fields, rows = table
    job = _job(fields)
    expected = outcome(lambda: _typed(job._values(row) for row in rows))
    assert_outcomes(outcome(lambda: _typed(_checked(job, rows))), expected, "compiled tests")
    sure = job.sure(rows)
    if sure is not None:  # what they are sure of, the checks give back unchanged
        assert _typed(sure) == expected


def test_edges():
    cases = [("DOUBLE", "double", v) for v in (math.inf, -math.inf, math.nan, -0.0, 3, True, 1e308)]
    cases += [("BIGINT", "bigint", v) for v in (2**63, -(2**63) - 1, True, Whole(1), 1.0)]
    cases += [("TIMESTAMP", "timestamp", v) for v in (TIMESTAMP_RANGE[0] - 1, TIMESTAMP_RANGE[1] + 1)]
    cases += [("DECIMAL", "decimal(12,2)", Decimal(v)) for v in ("1.5", "1.50", "0.00", "0", "9999999999.99",
                                                                    "99999999999.99", "NaN", "sNaN", "-Infinity",
                                                                    "1E+2", "-0.00")]
    cases += [("DECIMAL", "decimal(12,2)", v) for v in ("1.50", 3, 1.5)]
    cases += [("BOOLEAN", "boolean", v) for v in (1, 0, "true")]
    cases += [("STRING", "string", v) for v in (Text("x"), b"x", 1)]
    cases += [("FLOAT", "float", v) for v in (0.1, 1e300, math.nan, 3)]
    for ftype, kind, value in cases:
        job = _job([("x", ftype, kind)])
        rows = [{"x": value}]
        assert_outcomes(outcome(lambda: _typed(_checked(job, rows))),
                        outcome(lambda: _typed(job._values(row) for row in rows)), f"{ftype} {value!r}")


def _records(entries) -> list:
    return [("dts", 0, offset, env.SerializeToString()) for offset, env in enumerate(bridge.pack_entries(entries))]


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=150, deadline=None)
@given(columns=mysql_columns(max_size=6), data=st.data())
def test_the_job_gives_what_it_gave_with_the_checks(columns, data):
    """Whole jobs on Entries of random columns (and another table's): the output rows (positions
    and the error rows of PERMISSIVE included) and the tally are those of the job before (every
    value through the checks, the output extended column by column, `_Reference`)."""
    dts_columns = [pb.Column(name=name, originalType=type_text, isKey=key) for name, type_text, key in columns]
    entries = data.draw(st.lists(dml_entries(columns), min_size=1, max_size=6))
    for entry in entries:
        if data.draw(st.integers(0, 4)) == 0:
            entry.header.tableName = "other"
        else:
            entry.header.schemaName, entry.header.tableName = TABLE.split(".")
    # the schema of the columns, or of fewer (then rows hold fields the schema does not have)
    given_columns = dts_columns[:data.draw(st.integers(0, len(dts_columns)))] or dts_columns
    schema = record_schema(given_columns)
    fields = _tuple_fields(schema, given_columns)
    mode = data.draw(st.sampled_from(["PERMISSIVE", "DROPMALFORMED"]))
    positions = data.draw(st.booleans())
    outputs = []
    for make in (_PythonPath, _Reference):
        job = make(bridge.DEFAULT_OPTIONS, mode, TABLE, fields, positions)
        rows = [list(zip(*chunk)) for chunk in job.chunks(_records(entries))]
        outputs.append((_typed(row for chunk in rows for row in chunk), job.policy.tally))
    assert outputs[0] == outputs[1]


def test_the_benchmark_rows_are_sure():
    """The benchmark's table (benchmarks/workload.py) is what the compiled tests are for: every
    Entry's rows take them, so the benchmark measures them."""
    from benchmarks import workload
    work = workload.build(400, seed=1)
    first = next(e for e in work.entries if e.header.messageType == pb.DML)
    columns = list(first.event.dmlEvent.columns)
    fields = _tuple_fields(record_schema(columns), columns)
    job = _DtsToTuple(bridge.DEFAULT_OPTIONS, "FAILFAST", f"{first.header.schemaName}.{first.header.tableName}",
                      fields, False)
    for entry, raw in zip(work.entries, work.entry_bytes):
        rows = job._rows(entry, raw)
        assert job.sure(rows) is not None
