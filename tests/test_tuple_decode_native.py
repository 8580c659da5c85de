"""Tuple -> DTS: the C image encoder (`Plan.encode`, driven by bridge/tuple/decode.py's
`_NativeImages`) against the Python converters (FROM_TUPLE), the reference (issue 18, point 3).

Rows of generated column sets are decoded with `TupleDecoder(native=True)` and `native=False`
under several option sets, with the table's DTS columns and without them: row by row the same
Entries (byte for byte) or the same error, and the same unpaired halves at the end. The values are
both what the encoder writes from generated Entries and adversarial Tuple values (range edges of
the field and of the narrower column, Decimals of every exponent and negative zero, microseconds
the column's text cannot hold, the edges of the TIMESTAMP range, surrogates, non-canonical
base64, subclasses of int, str and Decimal, values of the wrong type).
"""
from __future__ import annotations

import base64
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bridge
from bridge import pb
from bridge.errors import BridgeError
from bridge.native import NATIVE
from bridge.tuple import FIELD_CHECKS, TIMESTAMP_RANGE, TupleDecoder, TupleEncoder, record_schema
from bridge.tuple import decode as tuple_decode
from bridge.tuple.encode import INT_RANGES, column_type
from bridge.values import BOOLEAN_PROPERTY
from support.native_paths import assert_outcomes, outcome
from support.strategies import dml_entries, mysql_columns
from support.tuple_form import holdable

needs_native = pytest.mark.skipif(not NATIVE, reason="C extension switched off (BRIDGE_PURE_PYTHON)")

OPTIONS = [bridge.DEFAULT_OPTIONS, bridge.Options(strict=True), bridge.Options(zero_dates="string"),
           bridge.Options(tuple_binary="hex", source_table=True), bridge.Options(timezone="Asia/Shanghai")]
OPTION_IDS = ["default", "strict", "zero-dates-string", "hex-source-table", "shanghai"]
TABLE = ("shop", "orders")


def _run(schema: dict, rows: list[dict], options, columns, native: bool) -> list:
    """Per row the serialised Entries it completes or its error; then the unpaired halves."""
    decoder = TupleDecoder(schema, options, table=TABLE, columns=columns, native=native)
    out = [outcome(lambda row=row: [e.SerializeToString() for e in decoder.feed(row)]) for row in rows]
    out.append([(type(e).__name__, str(e)) for e in decoder.finish()])
    return out


def assert_same_entries(schema: dict, rows: list[dict], options, columns) -> list:
    expected = _run(schema, rows, options, columns, native=False)
    got = _run(schema, rows, options, columns, native=True)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_outcomes(g, e, f"row {i + 1}" if i < len(rows) else "finish()")
    return expected


# ---- rows the encoder writes ----------------------------------------------------------------------

@needs_native
@pytest.mark.parametrize("options", OPTIONS, ids=OPTION_IDS)
@settings(suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_rows_the_encoder_writes_decode_as_in_python(data, options):
    entry = holdable(data.draw(dml_entries(columns=data.draw(mysql_columns(max_size=6)))))
    rows = outcome(lambda: TupleEncoder(options, native=False).convert(entry))
    if not isinstance(rows, list):
        return  # a value no Tuple field holds: nothing to decode
    columns = list(entry.event.dmlEvent.columns)
    schema = record_schema(columns, options)
    for given_columns in (columns, None):
        assert_same_entries(schema, rows, options, given_columns)


# ---- adversarial Tuple values -----------------------------------------------------------------------

class Int(int):
    pass


class Text(str):
    pass


class Dec(Decimal):
    def __str__(self) -> str:
        return "1.00"


def _decimals() -> st.SearchStrategy:
    digits = st.lists(st.integers(0, 9), min_size=1, max_size=40).map(tuple)
    plain = st.builds(lambda sign, ds, exp: Decimal((sign, ds, exp)), st.integers(0, 1), digits,
                      st.integers(-35, 5))
    return st.one_of(plain, st.sampled_from([Decimal("-0"), Decimal("-0.00"), Decimal("0E-2"), Decimal("1E+1"),
                                             Decimal("0.0000001"), Decimal("12.50"), Decimal("-12.50"),
                                             Decimal("18446744073709551615"), Decimal("18446744073709551616"),
                                             Decimal("5.0"), Dec("7.25")]),
                     st.integers(-(10**25), 10**25), st.sampled_from(["12.50", "1e3", "x"]))


_DAY = 86_400_000_000


def _micros() -> st.SearchStrategy:
    lo, hi = TIMESTAMP_RANGE
    year_one = -62135596800000000
    unit = st.sampled_from([1, 10, 100, 1000, 10_000, 100_000, 1_000_000, _DAY])
    multiples = st.builds(lambda k, u, off: k * u + off, st.integers(-(10**11), 10**11), unit,
                          st.sampled_from([0, 0, 0, 1, -1, 500, 999_999]))
    edges = st.sampled_from([lo, hi, lo - 1, hi + 1, year_one, year_one - 1000, year_one - _DAY, 0, -1,
                             253402300799000000, 253402300799999999])
    return st.one_of(multiples.filter(lambda v: lo <= v <= hi), edges, multiples.map(Int))


def _texts() -> st.SearchStrategy:
    b64 = st.binary(max_size=12).map(lambda b: base64.b64encode(b).decode("ascii"))
    return st.one_of(st.text(max_size=8), b64, st.binary(max_size=6).map(bytes.hex),
                     st.sampled_from(["", "\ud800", "a\udfffb", "QQ=", "QR==", "QQ==", "Q", "00:00:01", "{}",
                                      "zz", "0g"]), st.text(max_size=4).map(Text))


def _ints(field_type: str, ct) -> st.SearchStrategy:
    flo, fhi = INT_RANGES[field_type]
    edges = [flo, fhi, 0, -1, 1]
    if ct is not None and ct.kind in ("integer", "bit", "year"):
        lo, hi = ct.int_range
        edges += [v for v in (lo - 1, lo, hi, hi + 1) if flo <= v <= fhi]
    return st.one_of(st.integers(flo, fhi), st.sampled_from(edges), st.sampled_from(edges).map(Int))


def _floats(single: bool) -> st.SearchStrategy:
    return st.one_of(st.floats(width=32 if single else 64, allow_nan=False, allow_infinity=False),
                     st.sampled_from([0.0, -0.0, 1, -7, 5e-324, 1e300, 3.4028235e38, 1.1]))


def _column_decimals(ct) -> st.SearchStrategy:
    """Decimals near what a decimal(p,s) column holds: mostly at its scale, some a digit off either
    way, zeros of both signs, as many integer digits as it allows and one more."""
    precision, scale = ct.length, ct.scale or 0
    digits = st.lists(st.integers(0, 9), min_size=1, max_size=precision + 1).map(tuple)
    exponent = st.one_of(st.just(-scale), st.just(-scale), st.sampled_from([-scale - 1, -scale + 1, 0, 1]))
    zeros = st.builds(lambda sign, n, exp: Decimal((sign, (0,) * n, exp)), st.integers(0, 1), st.integers(1, 3),
                      exponent)
    return st.one_of(st.builds(lambda sign, ds, exp: Decimal((sign, ds, exp)), st.integers(0, 1), digits, exponent),
                     zeros)


def _wide_integers() -> st.SearchStrategy:
    """bigint unsigned as DECIMAL values: whole numbers around its range, some spelt with an exponent."""
    top = 2**64 - 1
    whole = st.one_of(st.integers(0, top), st.sampled_from([0, 1, top, top + 1, -1, 10**19, 10**19 - 1]),
                      st.integers(top - 2, top + 2), st.integers(top + 1, 10**20 - 1))
    return st.one_of(whole.map(Decimal), whole.map(lambda v: Decimal(v).scaleb(-1).scaleb(1)),
                     st.sampled_from([Decimal("5.0"), Decimal("1E+1"), Decimal("-0"), Decimal("0.5")]))


def _column_micros(ct) -> st.SearchStrategy:
    """Epoch microseconds mostly in whole units of the column's text (days for DATE), some not."""
    lo, hi = TIMESTAMP_RANGE
    unit = _DAY if ct.kind == "date" else 10 ** (6 - min(ct.fsp, 6))
    offset = st.one_of(st.just(0), st.just(0), st.sampled_from([1, -1, 1000, unit // 2]))
    return st.builds(lambda k, off: k * unit + off, st.integers(lo // unit, hi // unit), offset).filter(
        lambda v: lo <= v <= hi)


def _value(field_type: str, ct) -> st.SearchStrategy:
    kind = ct.kind if ct is not None else None
    if field_type == "DECIMAL" and kind == "decimal":
        domain = st.one_of(_column_decimals(ct), _decimals())
    elif field_type == "DECIMAL" and kind in ("integer", "bit"):
        domain = st.one_of(_wide_integers(), _decimals())
    elif field_type == "TIMESTAMP" and kind in ("date", "datetime", "timestamp"):
        domain = st.one_of(_column_micros(ct), _column_micros(ct), _micros())
    else:
        domains = {"DECIMAL": _decimals, "TIMESTAMP": _micros, "STRING": _texts, "BOOLEAN": st.booleans,
                   "DOUBLE": lambda: _floats(False), "FLOAT": lambda: _floats(True)}
        domain = domains[field_type]() if field_type in domains else _ints(field_type, ct)
    wrong = st.sampled_from([True, "1", 1.5, b"x", [1]])
    return st.one_of(st.none(), domain, domain, domain, domain, domain, domain, wrong)


_META = {"I": [("N", "Y")], "D": [("Y", "N")], "U": [("Y", "N"), ("N", "Y")]}


# the column types whose Tuple values are adapted before C writes them (bridge.tuple.decode._adapter)
_ADAPTED_TYPES = st.one_of(
    st.builds(lambda p, s: f"decimal({p},{min(s, p)})", st.integers(1, 40), st.integers(0, 12)),
    st.sampled_from(["bigint(20) unsigned", "int(10) unsigned", "mediumint(9)", "mediumint(8) unsigned",
                     "smallint(5) unsigned", "tinyint(3) unsigned", "date", "datetime", "timestamp", "year"]),
    st.integers(1, 63).map(lambda m: f"bit({m})"),
    st.builds(lambda family, fsp: f"{family}({fsp})", st.sampled_from(["datetime", "timestamp"]), st.integers(1, 6)))


@st.composite
def adapted_columns(draw) -> list[tuple[str, str, bool]]:
    names = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=3, unique=True))
    return [(name, draw(_ADAPTED_TYPES), False) for name in names]


@st.composite
def tuple_tables(draw, columns=None):
    """(options, DTS columns, RecordSchema, rows) with adversarial values for each field type."""
    options = draw(st.sampled_from(OPTIONS))
    columns_drawn = []
    for name, type_text, is_key in draw(mysql_columns(max_size=6) if columns is None else columns):
        column = pb.Column(name=name, originalType=type_text, isKey=is_key)
        if type_text == "tinyint(1)" and draw(st.booleans()):
            column.properties.add(key=BOOLEAN_PROPERTY, value="BOOLEAN")
        columns_drawn.append(column)
    columns = columns_drawn
    schema = record_schema(columns, options)
    types = [(f["name"], f["type"]) for f in schema["fields"][:len(columns)]]
    cts = [column_type(c, options) for c in columns]
    rows = []
    for number, op in enumerate(draw(st.lists(st.sampled_from("IUD"), min_size=1, max_size=4))):
        seq, time = str((number + 1) * 10**6 + draw(st.integers(0, 2))), draw(st.integers(0, 2**32 * 1000 - 1))
        for before, after in _META[op]:
            row = {name: draw(_value(ftype, ct)) for (name, ftype), ct in zip(types, cts)}
            row.update({"_sequence_id_": seq, "_operation_type_": op, "_execute_time_": time,
                        "_before_image_": before, "_after_image_": after})
            if options.source_table:
                row["_source_table_"] = draw(st.sampled_from(["shop.orders", "a.b.c", "nodot"]))
            rows.append(row)
    return options, columns, schema, rows


@needs_native
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=200)
@given(table=tuple_tables())
def test_adversarial_values_decode_as_in_python(table):
    options, columns, schema, rows = table
    for given_columns in (columns, None):
        assert_same_entries(schema, rows, options, given_columns)


@needs_native
@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=300)
@given(table=tuple_tables(adapted_columns()))
def test_adapted_values_decode_as_in_python(table):
    """The columns whose values are adapted for C, a few at a time, values near what they hold."""
    options, columns, schema, rows = table
    for given_columns in (columns, None):
        assert_same_entries(schema, rows, options, given_columns)


# ---- the C path is taken ------------------------------------------------------------------------

_EVERY_KIND = [("i", "int(11)"), ("u", "int(10) unsigned"), ("m", "mediumint(9)"), ("big", "bigint(20) unsigned"),
               ("d", "decimal(12,2)"), ("f", "float"), ("g", "double"), ("b", "tinyint(1)"), ("t", "varchar(20)"),
               ("vb", "varbinary(8)"), ("bl", "blob"), ("j", "json"), ("tm", "time"), ("dt", "date"),
               ("ts0", "datetime"), ("ts3", "timestamp(3)"), ("ts6", "datetime(6)"), ("tz6", "timestamp(6)"),
               ("y", "year"), ("bit", "bit(5)")]
_VALUES = {"i": -5, "u": 4294967295, "m": 8388607, "big": Decimal("18446744073709551615"), "d": Decimal("-12.50"),
           "f": 1.5, "g": 0.1, "b": True, "t": "caf\u00e9 \u5317\u4eac", "vb": "AAH/", "bl": "", "j": '{"a": 1}',
           "tm": "12:00:01", "dt": 19_000 * _DAY, "ts0": 1_700_000_000_000_000, "ts3": 1_700_000_000_123_000,
           "ts6": 1_700_000_000_123_456, "tz6": -1, "y": 2024, "bit": 31}
# one value per column that C must leave to the converters (they name the error or write it)
_NOT_SURE = {"u": -1, "m": 8388608, "big": Decimal("18446744073709551616"), "d": Decimal("-0.00"),
             "dt": 19_000 * _DAY + 1000, "ts0": 1_700_000_000_001_000, "ts3": 1_700_000_000_123_400,
             "bit": 32, "t": "\ud800", "vb": "AAH=", "big2": Decimal("5.0")}


def _decoder(native: bool = True) -> TupleDecoder:
    columns = [pb.Column(name=n, originalType=t) for n, t in _EVERY_KIND]
    columns[7].properties.add(key=BOOLEAN_PROPERTY, value="BOOLEAN")
    return TupleDecoder(record_schema(columns), table=TABLE, columns=columns, native=native)


def _row(**change) -> dict:
    return {**_VALUES, **change, "_sequence_id_": "9000000", "_operation_type_": "I", "_execute_time_": 1605339932000,
            "_before_image_": "N", "_after_image_": "Y"}


@needs_native
def test_every_c_kind_is_taken_and_writes_the_converters_data():
    decoder = _decoder()
    native = decoder._native(None, decoder._columns)
    assert isinstance(native, tuple_decode._NativeImages)
    values = [_VALUES[name] for name, _ in _EVERY_KIND]
    wire = native.wire(values, 2)
    assert wire is not None, "C left an image of plain values to Python"
    row = pb.RowChange()
    row.MergeFromString(wire)
    expected = _decoder(native=False)._image(decoder._codecs, values)
    assert list(row.newColumns) == expected
    assert [e.SerializeToString() for e in decoder.feed(_row())] == \
        [e.SerializeToString() for e in _decoder(native=False).feed(_row())]


@needs_native
@pytest.mark.parametrize("name", sorted(_NOT_SURE))
def test_values_c_is_not_sure_of_go_to_the_converters(name):
    decoder = _decoder()
    native = decoder._native(None, decoder._columns)
    column = "big" if name == "big2" else name
    values = [(_NOT_SURE[name] if n == column else _VALUES[n]) for n, _ in _EVERY_KIND]
    assert native.wire(values, 2) is None
    row = _row(**{column: _NOT_SURE[name]})
    assert_outcomes(outcome(lambda: [e.SerializeToString() for e in decoder.feed(row)]),
                    outcome(lambda: [e.SerializeToString() for e in _decoder(native=False).feed(row)]), name)


@needs_native
@pytest.mark.parametrize("options", [bridge.Options(tuple_binary="hex"), bridge.Options(timezone="Asia/Shanghai")],
                         ids=["hex", "shanghai"])
def test_tables_c_does_not_take_stay_python(options):
    columns = [pb.Column(name="id", originalType="bigint(20)"),
               pb.Column(name="x", originalType="blob" if options.tuple_binary == "hex" else "datetime")]
    decoder = TupleDecoder(record_schema(columns, options), options, table=TABLE, columns=columns)
    assert decoder._native(None, decoder._columns) is None


# ---- the compiled field checks ------------------------------------------------------------------

def _field_checks(decoder: TupleDecoder, row: dict):
    """FIELD_CHECKS one value at a time, as the decoder ran them before they were compiled."""
    values = []
    for name, ftype in decoder._fields:
        value = row.get(name)
        if value is not None:
            try:
                value = FIELD_CHECKS[ftype](value)
            except BridgeError as exc:
                raise exc.located(column=name)
        values.append(value)
    return values


def _typed(values) -> list:
    return [(type(v).__name__, repr(v)) for v in values]


@settings(suppress_health_check=[HealthCheck.too_slow], max_examples=200)
@given(table=st.one_of(tuple_tables(), tuple_tables(adapted_columns())))
def test_compiled_checks_match_the_field_checks(table):
    """Every field type's inline test lets through only values its check returns unchanged."""
    options, columns, schema, rows = table
    decoder = TupleDecoder(schema, options, table=TABLE, columns=columns)
    for row in rows:
        expected = outcome(lambda row=row: _typed(_field_checks(decoder, row)))
        got = outcome(lambda row=row: _typed(decoder._checked(row, decoder._check)))
        assert_outcomes(got, expected, "compiled checks")


@pytest.mark.parametrize("field_type, value", [
    ("DOUBLE", float("inf")), ("DOUBLE", float("nan")), ("DOUBLE", -0.0), ("DOUBLE", 3), ("BIGINT", 2**63),
    ("TINYINT", -129), ("TINYINT", True), ("TIMESTAMP", TIMESTAMP_RANGE[1] + 1), ("DECIMAL", Decimal("NaN")),
    ("DECIMAL", "1.5"), ("BOOLEAN", 1), ("STRING", Text("x")), ("FLOAT", 1e300), ("FLOAT", 0.1)])
def test_compiled_checks_edges(field_type, value):
    schema = {"fields": [{"name": "x", "type": field_type}, *record_schema([])["fields"]]}
    decoder = TupleDecoder(schema, table=TABLE)
    row = {"x": value}
    assert_outcomes(outcome(lambda: _typed(decoder._checked(row, decoder._check))),
                    outcome(lambda: _typed(_field_checks(decoder, row))), field_type)


@needs_native
def test_decimal_shapes_without_columns_build_a_bounded_number_of_encoders():
    """Without DTS columns each DECIMAL shape is a column set; values of ever new shapes must not
    cost a C encoder per row, and the Entries stay the converters'."""
    schema = {"fields": [{"name": "d", "type": "DECIMAL"}, *record_schema([])["fields"]]}
    shapes = [(k, s) for k in range(12) for s in range(12)]  # k + 1 integer digits, s fraction digits
    rows = [{"d": Decimal((0, (1,) * (k + 1 + s), -s)), "_sequence_id_": f"{n + 1}000000", "_operation_type_": "I",
             "_execute_time_": 1605339932000, "_before_image_": "N", "_after_image_": "Y"}
            for n, (k, s) in enumerate(shapes)]
    decoder = TupleDecoder(schema, table=TABLE)
    got = [e.SerializeToString() for row in rows for e in decoder.feed(row)]
    reference = TupleDecoder(schema, table=TABLE, native=False)
    assert got == [e.SerializeToString() for row in rows for e in reference.feed(row)]
    built = [n for n in decoder._natives.values() if n is not None]
    assert len(decoder._natives) == len(shapes) > tuple_decode._MAX_SHAPE_PLANS
    assert len(built) == tuple_decode._MAX_SHAPE_PLANS
