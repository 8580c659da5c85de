"""Hypothesis strategies for canonical Tencent DTS messages, shared by every round-trip test.

"Canonical" is what a well-behaved DTS producer emits, and what the bridge's lossless round trips
(law 1, tests/test_laws.py) must give back byte for byte once re-encoded:

* Entry: `header.version == 1`; `header.messageType` names the event and exactly that one event
  sub-message is present (empty ones through `SetInParent()`); no unknown fields or enum numbers.
* properties (header, event, column, row): KVPairs, keys unique within one list and never starting
  with the bridge's reserved prefix "datahub:"; most lists are empty.
* DML: 1..8 columns with unique names (case-insensitively, as in MySQL); every row image is aligned
  1:1 with the columns: INSERT has an empty old image and a full new one, DELETE the reverse, UPDATE
  both full; 1..4 rows per event. Key columns are never NIL or NA.
* Data carries only the fields its DataType uses: NIL a default Data, NA `dataType` only, integers,
  floats and decimals `sv` only, STRING `charset` + `bv`, BYTES `bv` only.
* Text forms:
  - integers: shortest decimal (no "+", no leading zeros, no "-0"), within the column's width;
  - FLOAT32 / FLOAT64: `repr(float)` of a finite value (FLOAT32 values are exact float32 values);
  - DECIMAL(P,S): exactly S fraction digits, at most P-S integer digits ("0" when none), never "-0";
  - temporal: ASCII text in `bv`, empty `charset`: DATE `YYYY-MM-DD`; DATETIME(fsp)
    `YYYY-MM-DD HH:MM:SS[.f*fsp]`; TIMESTAMP(fsp) `YYYY-MM-DD HH:MM:SS[.f*fsp] +HH:MM` (offset
    -12:00..+14:00 in quarter hours, `+00:00` for UTC); TIME(fsp) `[-]HH:MM:SS[.f*fsp]` (hours up to
    838, no "-" on zero); zero dates `0000-00-00` and `0000-00-00 00:00:00[.0*fsp]` (TIMESTAMP adds
    ` +00:00`);
  - STRING text in one of `MYSQL_CHARSETS` (latin1 is cp1252), binary/varbinary with charset
    `binary`; json is BYTES holding UTF-8 JSON text; blobs and geometry are arbitrary BYTES.

>>> from hypothesis import find
>>> find(dml_entries(), lambda e: len(e.event.dmlEvent.rows) > 1).header.messageType == pb.DML
True
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from typing import NamedTuple

from hypothesis import strategies as st

from bridge.values import FOREIGN_COLUMN_TYPES
from bridge.wire import subscribe_pb2 as pb
from support.wire_spec import varint

__all__ = [
    "RESERVED_PREFIX", "MYSQL_CHARSETS", "TYPE_STRATEGIES", "ROWS_FROM_ELSEWHERE", "MYSQL_TYPE_FAMILIES", "DDL_OPS",
    "MySQLType",
    "parse_mysql_type", "properties", "column_names", "mysql_types", "mysql_columns", "charsets",
    "column_charsets", "charset_text", "data_for", "headers", "dml_entries", "begin_entries", "commit_entries",
    "ddl_statements", "ddl_entries", "rollback_entries", "heartbeat_entries", "checkpoint_entries",
    "entries", "entry_streams", "envelope_streams", "unknown_field_bytes", "with_unknown_fields",
]

RESERVED_PREFIX = "datahub:"
UINT32 = 2**32 - 1
UINT64 = 2**64 - 1
INT64 = (-(2**63), 2**63 - 1)

# MySQL charset name -> Python codec and the largest code point MySQL stores in it.
MYSQL_CHARSETS = {
    "utf8mb4": ("utf-8", 0x10FFFF),
    "utf8": ("utf-8", 0xFFFF),
    "utf8mb3": ("utf-8", 0xFFFF),
    "latin1": ("cp1252", 0x10FFFF),
    "gbk": ("gbk", 0x10FFFF),
    "gb18030": ("gb18030", 0x10FFFF),
    "big5": ("big5", 0x10FFFF),
    "ascii": ("ascii", 0x7F),
}

# Tuple meta columns (docs/tuple.md, "Meta columns") are never data column names.
_META_COLUMNS = {"_sequence_id_", "_operation_type_", "_execute_time_", "_excute_time_",
                 "_before_image_", "_after_image_", "_source_table_"}


def _kv_key(text: str) -> bool:
    return not text.startswith(RESERVED_PREFIX)


@st.composite
def properties(draw, max_size: int = 2) -> list[tuple[str, str]]:
    """KVPairs as (key, value) lists: usually empty, keys unique, never in the reserved namespace."""
    if draw(st.integers(0, 3)):
        return []
    return draw(st.lists(st.tuples(st.text(max_size=12).filter(_kv_key), st.text(max_size=12)),
                         min_size=1, max_size=max_size, unique_by=lambda kv: kv[0]))


def _add_properties(message, pairs) -> None:
    for key, value in pairs:
        message.properties.add(key=key, value=value)


# ---- MySQL column types --------------------------------------------------------------------

class MySQLType(NamedTuple):
    family: str
    args: tuple
    unsigned: bool


_INT_FAMILIES = {  # family -> (bits, signed DataType, unsigned DataType, display widths)
    "tinyint": (8, pb.INT8, pb.UINT8, (4, 3)),
    "smallint": (16, pb.INT16, pb.UINT16, (6, 5)),
    "mediumint": (24, pb.INT32, pb.UINT32, (9, 8)),
    "int": (32, pb.INT32, pb.UINT32, (11, 10)),
    "bigint": (64, pb.INT64, pb.UINT64, (20, 20)),
}
_TEXT_FAMILIES = ("tinytext", "text", "mediumtext", "longtext")
_BLOB_FAMILIES = ("tinyblob", "blob", "mediumblob", "longblob", "geometry")
_NO_KEY_FAMILIES = set(_TEXT_FAMILIES) | set(_BLOB_FAMILIES) | {"json"}
_ZERO_DATE = "0000-00-00"
_ZERO_TIME = "00:00:00"


def _int_type(family: str) -> st.SearchStrategy[str]:
    signed_w, unsigned_w = _INT_FAMILIES[family][3]
    return st.sampled_from([family, f"{family}({signed_w})", f"{family} unsigned",
                            f"{family}({unsigned_w}) unsigned"])


def _fsp_type(family: str) -> st.SearchStrategy[str]:
    return st.one_of(st.just(family), st.integers(1, 6).map(lambda fsp: f"{family}({fsp})"))


_MEMBER = st.text(st.characters(categories=("L", "Nd"), exclude_characters="'\\,()"),
                  min_size=1, max_size=6)


def _members(kind: str) -> st.SearchStrategy[str]:
    members = st.lists(_MEMBER, min_size=1, max_size=5, unique_by=str.casefold)
    return members.map(lambda ms: f"{kind}(" + ",".join(f"'{m}'" for m in ms) + ")")


@st.composite
def _decimal_type(draw) -> str:
    precision = draw(st.integers(1, 65))
    return f"decimal({precision},{draw(st.integers(0, min(30, precision)))})"


# The generators, keyed by the row of the type table (bridge/values/types.py, `TYPES`) their columns
# parse to: row kind -> {family -> strategy of the column's type text as DTS writes it in
# Column.originalType}. tests/test_types_once.py compares the keys with the rows in use, so a row
# without a generator here (or in ROWS_FROM_ELSEWHERE) fails there, and checks that every family's
# types parse to the row it is filed under.
TYPE_STRATEGIES: dict[str, dict[str, st.SearchStrategy[str]]] = {
    "integer": {**{family: _int_type(family) for family in _INT_FAMILIES}, "bool": st.just("tinyint(1)")},
    "bit": {"bit": st.integers(1, 64).map(lambda m: f"bit({m})")},
    "year": {"year": st.sampled_from(["year", "year(4)"])},
    "float": {"float": st.just("float"), "double": st.just("double")},
    "decimal": {"decimal": _decimal_type()},
    "text": {
        "char": st.integers(1, 255).map(lambda n: f"char({n})"),
        "varchar": st.integers(1, 2000).map(lambda n: f"varchar({n})"),
        **{family: st.just(family) for family in _TEXT_FAMILIES},
        "enum": _members("enum"),
        "set": _members("set"),
    },
    "binary": {"binary": st.integers(1, 32).map(lambda n: f"binary({n})"),
               "varbinary": st.integers(1, 255).map(lambda n: f"varbinary({n})")},
    "bytes": {family: st.just(family) for family in _BLOB_FAMILIES},
    "json": {"json": st.just("json")},
    "date": {"date": st.just("date")},
    "datetime": {"datetime": _fsp_type("datetime")},
    "timestamp": {"timestamp": _fsp_type("timestamp")},
    "time": {"time": _fsp_type("time")},
}

# Rows no canonical DTS producer writes (their mark is a reserved-prefix property, which these
# strategies never make), and the Blob type of support.blob_strategies.FOREIGN_VALUES whose foreign
# columns reach them instead (values.FOREIGN_COLUMN_TYPES gives the DTS column).
ROWS_FROM_ELSEWHERE: dict[str, str] = {
    "boolean": "BOOLEAN",  # tinyint(1) marked datahub:type=BOOLEAN: a DataHub BOOLEAN
}

# family -> strategy of the column's type text as DTS writes it in Column.originalType
MYSQL_TYPE_FAMILIES: dict[str, st.SearchStrategy[str]] = {
    family: strategy for families in TYPE_STRATEGIES.values() for family, strategy in families.items()}

_TYPE_TEXT = re.compile(r"^(?P<family>[a-z]+)(?:\((?P<args>.*)\))?(?P<unsigned> unsigned)?$")


def parse_mysql_type(text: str) -> MySQLType:
    """`bigint(20) unsigned` -> MySQLType('bigint', (20,), True); enum/set args are the members.

    >>> parse_mysql_type("enum('a','b')")
    MySQLType(family='enum', args=('a', 'b'), unsigned=False)
    """
    match = _TYPE_TEXT.match(text)
    if match is None:
        raise ValueError(f"not a MySQL column type: {text!r}")
    family, raw, unsigned = match.group("family"), match.group("args"), bool(match.group("unsigned"))
    if raw is None:
        args: tuple = ()
    elif family in ("enum", "set"):
        args = tuple(re.findall(r"'([^']*)'", raw))
    else:
        args = tuple(int(a) for a in raw.split(","))
    if family == "tinyint" and args == (1,) and not unsigned:
        family = "bool"
    return MySQLType(family, args, unsigned)


def mysql_types() -> st.SearchStrategy[str]:
    """Type text of any family in MYSQL_TYPE_FAMILIES."""
    return st.sampled_from(sorted(MYSQL_TYPE_FAMILIES)).flatmap(MYSQL_TYPE_FAMILIES.__getitem__)


def column_names() -> st.SearchStrategy[str]:
    """Names MySQL accepts inside backticks: unicode letters, digits, `_`, `$`, inner spaces."""
    chars = st.characters(categories=("L", "Nd"), include_characters="_$ ", exclude_characters="`")
    return st.text(chars, min_size=1, max_size=12).filter(
        lambda s: s.strip() == s and s not in _META_COLUMNS)


_FOREIGN_TYPES = sorted(type_text for type_text, _ in FOREIGN_COLUMN_TYPES.values())


@st.composite
def mysql_columns(draw, min_size: int = 1, max_size: int = 8, names=None) -> list[tuple[str, str, bool]]:
    """(name, originalType, isKey) per column; names unique case-insensitively, maybe no key at all.
    One table in six has only the types a Blob message without the extension decodes to
    (bigint(20), double, tinyint(1), longtext, longblob, datetime(3)): there the encoder leaves the
    extension out of a message that says nothing new, a path of its own."""
    names = draw(st.lists(names or column_names(), min_size=min_size, max_size=max_size,
                          unique_by=str.casefold))
    foreign = draw(st.integers(0, 5)) == 0
    columns = []
    for name in names:
        type_text = draw(st.sampled_from(_FOREIGN_TYPES) if foreign else mysql_types())
        keyable = parse_mysql_type(type_text).family not in _NO_KEY_FAMILIES
        columns.append((name, type_text, keyable and draw(st.integers(0, 3)) == 0))
    return columns


# ---- values --------------------------------------------------------------------------------

def charsets() -> st.SearchStrategy[str]:
    return st.sampled_from(sorted(MYSQL_CHARSETS))


def charset_text(charset: str, max_size: int = 16) -> st.SearchStrategy[str]:
    """Text every character of which MySQL can store in `charset`."""
    codec, top = MYSQL_CHARSETS[charset]
    return st.text(st.characters(codec=codec, max_codepoint=top), max_size=max_size)


def _storable(text: str, charset: str) -> bool:
    codec, top = MYSQL_CHARSETS[charset]
    try:
        text.encode(codec)
    except UnicodeEncodeError:
        return False
    return all(ord(c) <= top for c in text)


def column_charsets(original_type: str) -> st.SearchStrategy[str]:
    """Charsets a column of this type can have: for enum and set, those that hold every member."""
    t = parse_mysql_type(original_type)
    if t.family in ("enum", "set"):
        return st.sampled_from([c for c in sorted(MYSQL_CHARSETS) if all(_storable(m, c) for m in t.args)])
    return charsets()


def _string(charset: str, text: str) -> pb.Data:
    return pb.Data(dataType=pb.STRING, charset=charset, bv=text.encode(MYSQL_CHARSETS[charset][0]))


def _ascii(text: str) -> pb.Data:
    return pb.Data(dataType=pb.STRING, bv=text.encode("ascii"))


def _fraction(micro: int, fsp: int) -> str:
    return "." + f"{micro:06d}"[:fsp] if fsp else ""


def _ymd_hms(d) -> str:
    # strftime drops the leading zeros of years below 1000 on glibc
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d} {d.hour:02d}:{d.minute:02d}:{d.second:02d}"


def _int_value(t: MySQLType, draw) -> pb.Data:
    bits, signed_type, unsigned_type, _ = _INT_FAMILIES[t.family]
    if t.unsigned:
        return pb.Data(dataType=unsigned_type, sv=str(draw(st.integers(0, 2**bits - 1))))
    low = -(2 ** (bits - 1))
    return pb.Data(dataType=signed_type, sv=str(draw(st.integers(low, -low - 1))))


def _bool_value(t, draw) -> pb.Data:
    return pb.Data(dataType=pb.INT8, sv=str(draw(st.one_of(st.sampled_from([0, 1]), st.integers(-128, 127)))))


def _bit_value(t, draw) -> pb.Data:
    value = draw(st.integers(0, 2 ** (t.args[0] if t.args else 1) - 1))
    return pb.Data(dataType=pb.INT64 if value <= INT64[1] else pb.UINT64, sv=str(value))


def _year_value(t, draw) -> pb.Data:
    return pb.Data(dataType=pb.INT64, sv=str(draw(st.one_of(st.just(0), st.integers(1901, 2155)))))


def _float_value(t, draw) -> pb.Data:
    width = 32 if t.family == "float" else 64
    value = draw(st.floats(width=width, allow_nan=False, allow_infinity=False))
    return pb.Data(dataType=pb.FLOAT32 if width == 32 else pb.FLOAT64, sv=repr(float(value)))


def _decimal_value(t, draw) -> pb.Data:
    precision = t.args[0] if t.args else 10  # MySQL's default DECIMAL is decimal(10,0)
    scale = t.args[1] if len(t.args) > 1 else 0
    unscaled = draw(st.integers(-(10**precision - 1), 10**precision - 1))
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    text = digits if scale == 0 else f"{digits[:-scale]}.{digits[-scale:]}"
    return pb.Data(dataType=pb.DECIMAL, sv=("-" if unscaled < 0 else "") + text)


def _char_value(t, draw, charset) -> pb.Data:
    limit = min(t.args[0], 12) if t.args else 12
    return _string(charset, draw(charset_text(charset, limit)))


def _text_value(t, draw, charset) -> pb.Data:
    return _string(charset, draw(charset_text(charset, 40)))


def _enum_value(t, draw, charset) -> pb.Data:
    # A member the column's charset cannot hold reads back as '' (MySQL's invalid-value member).
    members = [m for m in t.args if _storable(m, charset)] or [""]
    if t.family == "enum":
        return _string(charset, draw(st.sampled_from(members)))
    chosen = draw(st.sets(st.sampled_from(members)))
    return _string(charset, ",".join(m for m in members if m in chosen))


def _binary_value(t, draw) -> pb.Data:
    size = t.args[0]
    raw = draw(st.binary(min_size=size, max_size=size) if t.family == "binary"
               else st.binary(max_size=min(size, 32)))
    return pb.Data(dataType=pb.STRING, charset="binary", bv=raw)


def _blob_value(t, draw) -> pb.Data:
    return pb.Data(dataType=pb.BYTES, bv=draw(st.binary(max_size=64)))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), UINT64)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def _json_value(t, draw) -> pb.Data:
    return pb.Data(dataType=pb.BYTES, bv=json.dumps(draw(_JSON), ensure_ascii=False).encode("utf-8"))


def _zero(draw) -> bool:
    return draw(st.integers(0, 9)) == 0


def _date_value(t, draw) -> pb.Data:
    return _ascii(_ZERO_DATE if _zero(draw) else draw(st.dates()).isoformat())


def _fsp(t) -> int:
    return t.args[0] if t.args else 0


def _datetime_value(t, draw) -> pb.Data:
    fsp = _fsp(t)
    if _zero(draw):
        return _ascii(f"{_ZERO_DATE} {_ZERO_TIME}{_fraction(0, fsp)}")
    value = draw(st.datetimes())
    return _ascii(_ymd_hms(value) + _fraction(value.microsecond, fsp))


def _timestamp_value(t, draw) -> pb.Data:
    fsp = _fsp(t)
    if _zero(draw):
        return _ascii(f"{_ZERO_DATE} {_ZERO_TIME}{_fraction(0, fsp)} +00:00")
    value = draw(st.datetimes(datetime(1970, 1, 2), datetime(2038, 1, 18)))
    quarters = draw(st.integers(-48, 56))  # -12:00 .. +14:00
    sign = "-" if quarters < 0 else "+"
    hours, minutes = divmod(abs(quarters) * 15, 60)
    return _ascii(f"{_ymd_hms(value)}{_fraction(value.microsecond, fsp)} {sign}{hours:02d}:{minutes:02d}")


def _time_value(t, draw) -> pb.Data:
    fsp = _fsp(t)
    unit = 10 ** (6 - fsp)  # microseconds per last fraction digit
    top = (838 * 3600 + 59 * 60 + 59) * 10**6 // unit
    ticks = draw(st.integers(-top, top))
    seconds, micro = divmod(abs(ticks) * unit, 10**6)
    minutes, sec = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    sign = "-" if ticks < 0 else ""
    return _ascii(f"{sign}{hours:02d}:{minute:02d}:{sec:02d}{_fraction(micro, fsp)}")


# family -> value builder (type, draw) for families whose values need no charset
_VALUES = {
    **{family: _int_value for family in _INT_FAMILIES},
    "bool": _bool_value, "bit": _bit_value, "year": _year_value,
    "float": _float_value, "double": _float_value, "decimal": _decimal_value,
    "binary": _binary_value, "varbinary": _binary_value,
    **{family: _blob_value for family in _BLOB_FAMILIES},
    "json": _json_value,
    "date": _date_value, "datetime": _datetime_value, "timestamp": _timestamp_value, "time": _time_value,
}
# family -> value builder (type, draw, charset) for character data
_TEXT_VALUES = {
    "char": _char_value, "varchar": _char_value,
    **{family: _text_value for family in _TEXT_FAMILIES},
    "enum": _enum_value, "set": _enum_value,
}
assert set(_VALUES) | set(_TEXT_VALUES) == set(MYSQL_TYPE_FAMILIES)


@st.composite
def data_for(draw, original_type: str, charset: str | None = None, nullable: bool = True,
             absent: bool = True) -> pb.Data:
    """One canonical Data for a column of `original_type`: NIL (1 in 10) when `nullable`, NA
    (1 in 10) when `absent`, else a value; character columns use `charset` (drawn when None)."""
    roll = draw(st.integers(0, 9))
    if nullable and roll == 0:
        return pb.Data()
    if absent and roll == 1:
        return pb.Data(dataType=pb.NA)
    t = parse_mysql_type(original_type)
    if t.family in _TEXT_VALUES:
        return _TEXT_VALUES[t.family](t, draw, charset or draw(column_charsets(original_type)))
    return _VALUES[t.family](t, draw)


# ---- headers and entries -------------------------------------------------------------------

_NAME = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)
_GTID = st.one_of(
    st.just(""),
    st.tuples(st.uuids(), st.integers(1, 2**63 - 1)).map(lambda u: f"{u[0]}:{u[1]}"),
    st.text(max_size=20))
_BINLOG = st.one_of(st.integers(1, 999999).map(lambda n: f"mysql-bin.{n:06d}"), st.text(max_size=16))


@st.composite
def headers(draw, message_type: int, table: bool | None = None) -> pb.Header:
    """A canonical Header for `message_type`; `table=True` always names a schema and table."""
    named = draw(st.booleans()) if table is None else table
    header = pb.Header(
        version=1,
        sourceType=draw(st.sampled_from(pb.SourceType.values())),
        messageType=message_type,
        timestamp=draw(st.integers(0, UINT32)),
        serverId=draw(st.integers(*INT64)),
        fileName=draw(_BINLOG),
        position=draw(st.integers(0, UINT64)),
        gtid=draw(_GTID),
        schemaName=draw(_NAME) if named else "",
        tableName=draw(_NAME) if named else "",
        seqId=draw(st.integers(0, UINT64)),
        eventIndex=draw(st.integers(0, UINT64)),
        isLast=draw(st.booleans()),
    )
    _add_properties(header, draw(properties()))
    return header


def _entry(draw, message_type: int, table: bool | None = None) -> pb.Entry:
    entry = pb.Entry(header=draw(headers(message_type, table)))
    _add_properties(entry.event, draw(properties()))
    return entry


@st.composite
def dml_entries(draw, columns: list | None = None, dml_type: int | None = None) -> pb.Entry:
    """A DML Entry over `columns` ((name, originalType, isKey), drawn when None), 1..4 rows."""
    columns = draw(mysql_columns()) if columns is None else columns
    kind = draw(st.sampled_from(pb.DMLType.values())) if dml_type is None else dml_type
    entry = _entry(draw, pb.DML, table=True)
    dml = entry.event.dmlEvent
    dml.dmlEventType = kind
    charset_of = []
    for name, type_text, is_key in columns:
        column = dml.columns.add(name=name, originalType=type_text, isKey=is_key)
        _add_properties(column, draw(properties(max_size=1)))
        charset_of.append(draw(column_charsets(type_text)))

    def image():
        return [draw(data_for(type_text, charset, nullable=not is_key, absent=not is_key))
                for (_, type_text, is_key), charset in zip(columns, charset_of)]

    for _ in range(draw(st.integers(1, 4))):
        row = dml.rows.add()
        if kind in (pb.UPDATE, pb.DELETE):
            row.oldColumns.extend(image())
        if kind in (pb.UPDATE, pb.INSERT):
            row.newColumns.extend(image())
        _add_properties(row, draw(properties(max_size=1)))
    return entry


_TRANSACTION_ID = st.one_of(st.integers(0, UINT64).map(str), _GTID)


@st.composite
def begin_entries(draw) -> pb.Entry:
    entry = _entry(draw, pb.BEGIN)
    entry.event.beginEvent.SetInParent()
    entry.event.beginEvent.transactionId = draw(_TRANSACTION_ID)
    entry.event.beginEvent.threadId = draw(st.integers(*INT64))
    return entry


@st.composite
def commit_entries(draw) -> pb.Entry:
    entry = _entry(draw, pb.COMMIT)
    entry.event.commitEvent.SetInParent()
    entry.event.commitEvent.transactionId = draw(_TRANSACTION_ID)
    return entry


@st.composite
def rollback_entries(draw) -> pb.Entry:
    entry = _entry(draw, pb.ROLLBACK)
    entry.event.rollbackEvent.SetInParent()
    return entry


@st.composite
def heartbeat_entries(draw) -> pb.Entry:
    entry = _entry(draw, pb.HEARTBEAT)
    entry.event.heartbeatEvent.SetInParent()
    entry.event.heartbeatEvent.epoch = draw(st.integers(*INT64))
    return entry


@st.composite
def checkpoint_entries(draw) -> pb.Entry:
    entry = _entry(draw, pb.CHECKPOINT)
    checkpoint = entry.event.checkpointEvent
    checkpoint.SetInParent()
    checkpoint.syncedGtid = draw(_GTID)
    checkpoint.fakeGtid = draw(st.booleans())
    checkpoint.fileName = draw(_BINLOG)
    checkpoint.position = draw(st.integers(0, UINT64))
    return entry


# ---- DDL statements ------------------------------------------------------------------------

# Statement templates by the Blob op docs/mapping.md ("DDL statement -> op") expects for them. Upper-case words are
# keywords (their case is varied); {t}/{u} are table names, {c} a column, {i} an index, {d} a
# database name.
DDL_OPS: dict[str, tuple[str, ...]] = {
    "CREATE": ("CREATE TABLE {t} ({c} INT PRIMARY KEY)",
               "CREATE TABLE IF NOT EXISTS {t} LIKE {u}",
               "CREATE TEMPORARY TABLE {t} ({c} VARCHAR(10))"),
    "ALTER": ("ALTER TABLE {t} ADD COLUMN {c} BIGINT NOT NULL DEFAULT 0",
              "ALTER TABLE {t} DROP COLUMN {c}",
              "ALTER TABLE {t} ADD INDEX {i} ({c})",
              "ALTER TABLE {t} RENAME TO {u}"),
    "ERASE": ("DROP TABLE {t}", "DROP TABLE IF EXISTS {t}, {u}", "DROP TEMPORARY TABLE {t}"),
    "TRUNCATE": ("TRUNCATE TABLE {t}", "TRUNCATE {t}"),
    "RENAME": ("RENAME TABLE {t} TO {u}", "RENAME TABLE {t} TO {u}, {u} TO {t}"),
    "CINDEX": ("CREATE INDEX {i} ON {t} ({c})", "CREATE UNIQUE INDEX {i} ON {t} ({c})",
               "CREATE FULLTEXT INDEX {i} ON {t} ({c})"),
    "DINDEX": ("DROP INDEX {i} ON {t}",),
    "QUERY": ("CREATE DATABASE {d}", "DROP DATABASE IF EXISTS {d}", "ALTER DATABASE {d} CHARACTER SET utf8mb4",
              "CREATE VIEW {t} AS SELECT 1", "CREATE OR REPLACE VIEW {t} AS SELECT {c} FROM {u}",
              "DROP VIEW {t}", "CREATE TABLESPACE {d} ADD DATAFILE 'x.ibd'", "DROP TABLESPACE {d}",
              "GRANT SELECT ON {d}.* TO 'u'@'%'", "CREATE USER 'u'@'%' IDENTIFIED BY 'p'",
              "FLUSH PRIVILEGES", "CREATE TRIGGER {i} BEFORE INSERT ON {t} FOR EACH ROW SET @x = 1",
              "ANALYZE TABLE {t}", "OPTIMIZE TABLE {t}"),
}

_PLAIN_ID = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
_QUOTED_ID = st.text(st.characters(codec="utf-8", exclude_characters="`\x00"), min_size=1,
                     max_size=10).map(lambda s: f"`{s}`")
_IDENT = st.one_of(_PLAIN_ID, _QUOTED_ID)
_COMMENT_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\r\n*\x00"), max_size=10).map(str.strip)
_LEADING = st.lists(st.one_of(
    st.sampled_from([" ", "\t", "\n", "\r\n"]),
    _COMMENT_TEXT.map(lambda s: f"/* {s} */"),
    _COMMENT_TEXT.map(lambda s: f"-- {s}\n"),
    _COMMENT_TEXT.map(lambda s: f"# {s}\n"),
), max_size=3).map("".join)
_KEYWORD = re.compile(r"\b[A-Z][A-Z_]+\b")


def _recase(sql: str, mode: str) -> str:
    if mode == "upper":
        return sql
    change = {"lower": str.lower, "title": str.title,
              "mixed": lambda w: "".join(c.lower() if i % 2 else c for i, c in enumerate(w))}[mode]
    return _KEYWORD.sub(lambda m: change(m.group(0)), sql)


@st.composite
def ddl_statements(draw) -> tuple[str, str]:
    """(sql, expected op) pairs: every kind of statement, with leading comments/whitespace,
    backticked or schema-qualified names, keyword case varied and an optional trailing `;`."""
    op = draw(st.sampled_from(sorted(DDL_OPS)))
    # Keywords are re-cased before the names go in, so names keep their own case.
    case = draw(st.sampled_from(["upper", "lower", "title", "mixed"]))
    body = _recase(draw(st.sampled_from(DDL_OPS[op])), case)
    # One placeholder at a time: str.format would trip on braces inside quoted names.
    for slot in ("{t}", "{u}", "{c}", "{i}", "{d}"):
        while slot in body:
            name = draw(_IDENT)
            if slot in ("{t}", "{u}") and draw(st.booleans()):
                name = f"{draw(_IDENT)}.{name}"
            body = body.replace(slot, name, 1)
    return draw(_LEADING) + body + draw(st.sampled_from(["", ";", " ;", "\n"])), op


@st.composite
def ddl_entries(draw) -> pb.Entry:
    entry = _entry(draw, pb.DDL)
    ddl = entry.event.ddlEvent
    ddl.SetInParent()
    ddl.schemaName = draw(st.one_of(st.just(entry.header.schemaName), _NAME))
    ddl.sql = draw(ddl_statements())[0]
    ddl.executionTime = draw(st.integers(0, UINT32))
    return entry


# ---- streams ---------------------------------------------------------------------------------

def entries() -> st.SearchStrategy[pb.Entry]:
    """A canonical Entry of any MessageType (DML, which carries the values, drawn more often)."""
    return st.one_of(dml_entries(), dml_entries(), dml_entries(), begin_entries(), commit_entries(), ddl_entries(),
                     rollback_entries(), heartbeat_entries(), checkpoint_entries())


@st.composite
def entry_streams(draw, min_size: int = 0, max_size: int = 8, elements=None) -> list[pb.Entry]:
    """Lists of Entry (from `elements`, default `entries()`) whose seqIds strictly increase."""
    items = draw(st.lists(elements or entries(), min_size=min_size, max_size=max_size))
    seq_ids = draw(st.lists(st.integers(0, UINT64), min_size=len(items), max_size=len(items), unique=True))
    for entry, seq_id in zip(items, sorted(seq_ids)):
        entry.header.seqId = seq_id
    return items


_SEGMENT_OVERHEAD = 20  # version, total, index and the data tag and length, at their largest


@st.composite
def envelope_streams(draw, max_size: int | None = None) -> tuple[list[pb.Entry], list[pb.Envelope]]:
    """(entries, envelopes): entry_streams(min_size=1) grouped into Entries and framed into
    Envelopes of at most `max_size` encoded bytes (drawn from 64..4096 when None), without using
    the bridge's own framing: group sizes and segment sizes are drawn independently."""
    limit = draw(st.integers(64, 4096)) if max_size is None else max_size
    items = draw(entry_streams(min_size=1))
    envelopes: list[pb.Envelope] = []
    start = 0
    while start < len(items):
        stop = draw(st.integers(start + 1, len(items)))
        data = pb.Entries(items=items[start:stop]).SerializeToString()
        start = stop
        single = pb.Envelope(version=1, total=1, data=data)
        if single.ByteSize() <= limit:
            envelopes.append(single)
            continue
        most = limit - _SEGMENT_OVERHEAD
        chunk = draw(st.integers(max(1, most // 2), most))
        total = -(-len(data) // chunk)
        envelopes.extend(pb.Envelope(version=1, total=total, index=i, data=data[i * chunk:(i + 1) * chunk])
                         for i in range(total))
    assert all(env.ByteSize() <= limit for env in envelopes)
    return items, envelopes


# ---- unknown fields: what protobuf keeps of a field its schema does not declare ------------------

@st.composite
def unknown_field_bytes(draw, descriptor) -> bytes:
    """One to three fields protobuf keeps as unknown in a message of `descriptor`: an undeclared
    number, or a declared one of another wire type, of every wire type (a group too), with
    overlong varints now and then (protobuf keeps unknown bytes verbatim)."""
    declared = {f.number: f for f in descriptor.fields}
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        number = draw(st.integers(1, 40) | st.integers(1, 2**29 - 1))
        kinds = [0, 1, 2, 3, 5]
        if number in declared:  # only a wire type it does not have makes it unknown
            f = declared[number]
            has = 2 if f.message_type is not None or f.type in (f.TYPE_STRING, f.TYPE_BYTES) else 0
            kinds.remove(has)
        kind = draw(st.sampled_from(kinds))
        tag = varint(number << 3 | kind)
        if kind == 0:
            body = varint(draw(st.integers(0, 2**64 - 1)))
            if draw(st.integers(0, 4)) == 0 and len(body) < 10:
                body = bytes(b | 0x80 for b in body) + b"\x00"  # overlong, one byte more
        elif kind == 1:
            body = draw(st.binary(min_size=8, max_size=8))
        elif kind == 5:
            body = draw(st.binary(min_size=4, max_size=4))
        elif kind == 2:
            payload = draw(st.binary(max_size=12))
            body = varint(len(payload)) + payload
        else:  # a group: a varint field inside, then its end tag
            body = varint(1 << 3) + varint(draw(st.integers(0, 2**32))) + varint(number << 3 | 4)
        out += tag + body
    return out


def _present_messages(message) -> list:
    """The message and every sub-message set in it, all the way down (KVPairs with the reserved
    prefix aside: the bridge rebuilds those from their values)."""
    out = [message]
    for fd, value in message.ListFields():
        if fd.message_type is None:
            continue
        for item in (value if fd.is_repeated else [value]):
            if fd.name == "properties" and item.key.startswith(RESERVED_PREFIX):
                continue
            out.extend(_present_messages(item))
    return out


@st.composite
def with_unknown_fields(draw, entries_strategy) -> pb.Entry:
    """An Entry of `entries_strategy` with unknown fields merged into one to four of its messages
    (the Entry itself, its header, event, columns, rows, values, properties...)."""
    entry = draw(entries_strategy)
    targets = _present_messages(entry)
    for _ in range(draw(st.integers(1, 4))):
        target = draw(st.sampled_from(targets))
        target.MergeFromString(draw(unknown_field_bytes(target.DESCRIPTOR)))
    return entry
