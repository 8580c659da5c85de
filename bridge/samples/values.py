"""Values for the sample streams: how DTS encodes one MySQL value as `Data`, value generators,
the Col / Table / Change building blocks (FULL and MINIMAL row images), and the edge rows.

The encoder here is the generator's own reading of the value encoding (docs/mapping.md, "Column types"), kept apart
from the converters' tables on purpose: the samples are an independent witness of the format,
so a mistake in one side's mapping shows up as a test failure instead of agreeing with itself.

>>> encode_value("tinyint(3) unsigned", "", 255)
dataType: UINT8
sv: "255"
<BLANKLINE>
"""
from __future__ import annotations

import datetime as _dt
import random
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace

from bridge.wire import subscribe_pb2 as pb

__all__ = ["NULL", "NULL_ON_WIRE", "NA", "CHARSET_CODECS", "wire_bytes", "REAL_ORDERS", "REAL_SUPPLIERS",
           "realistic_rows", "realistic_entries", "ColumnType", "encode_value", "mysql_json", "wkb_point",
           "wkb_polygon", "RowContext", "serial", "one_of", "integer", "real", "decimal", "words",
           "raw_bytes", "moment", "clock", "json_doc", "nullable", "Col", "Table", "FULL", "MINIMAL",
           "Change", "insert", "update", "delete", "ALL_TYPES_EDGE_ROWS", "CHARSET_EDGE_ROWS", "TEXTS"]

NULL = None  # SQL NULL -> Data NIL


class _Absent:
    """The column is not in this row image (binlog_row_image=MINIMAL) -> Data NA."""

    def __repr__(self) -> str:
        return "NA"


NA = _Absent()


class _NilOnWire:
    """SQL NULL with `dataType: NIL` written out on the wire (`08 00`), as a producer that writes
    default values sends it; plain NULL is an empty Data (no bytes). Both parse to the same Data."""

    def __repr__(self) -> str:
        return "NIL"


NULL_ON_WIRE = _NilOnWire()
_NIL_MARK = 127  # stands for NULL_ON_WIRE in a generated Entry until `wire_bytes` writes it


def wire_bytes(entry: pb.Entry) -> bytes:
    """The Entry's bytes as the producer writes them: each NULL_ON_WIRE Data as `08 00` (protobuf
    itself would write nothing for NIL). Row images are fields 1 and 2 of RowChange."""
    raw = entry.SerializeToString()
    marks = sum(d.dataType == _NIL_MARK for row in entry.event.dmlEvent.rows
                for d in (*row.oldColumns, *row.newColumns))
    if not marks:
        return raw
    out = raw
    for tag in (b"\x0a", b"\x12"):
        out = out.replace(tag + b"\x02\x08\x7f", tag + b"\x02\x08\x00")
    # a generated value holding the mark's bytes would be rewritten too: fail loudly, never silently
    if out.count(b"\x02\x08\x00") - raw.count(b"\x02\x08\x00") != marks:
        raise ValueError(f"seqId {entry.header.seqId}: NULL_ON_WIRE marks do not match the bytes")
    return out

# MySQL charset name -> Python codec; MySQL's "latin1" is really Windows-1252.
CHARSET_CODECS = {"utf8mb4": "utf-8", "utf8": "utf-8", "utf8mb3": "utf-8", "latin1": "cp1252",
                  "gbk": "gbk", "gb18030": "gb18030", "big5": "big5"}

# family -> (bits, signed DataType, unsigned DataType)
_INTEGERS = {"tinyint": (8, pb.INT8, pb.UINT8), "smallint": (16, pb.INT16, pb.UINT16),
             "mediumint": (24, pb.INT32, pb.UINT32), "int": (32, pb.INT32, pb.UINT32),
             "bigint": (64, pb.INT64, pb.UINT64)}
_TEXT = {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
_BINARY_TEXT = {"binary", "varbinary"}
_BYTES = {"json", "tinyblob", "blob", "mediumblob", "longblob", "geometry", "point", "linestring",
          "polygon", "multipoint", "multilinestring", "multipolygon", "geometrycollection"}
_FRACTION = r"(?:\.(\d+))?"
_TEMPORAL = {"date": re.compile(r"\d{4}-\d\d-\d\d()"),
             "datetime": re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d" + _FRACTION),
             "timestamp": re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d" + _FRACTION + r" [+-]\d\d:\d\d"),
             "time": re.compile(r"-?\d{2,3}:\d\d:\d\d" + _FRACTION)}


@dataclass(frozen=True)
class ColumnType:
    """A MySQL column type as `Column.originalType` prints it, e.g. `decimal(30,9)`."""
    text: str

    @property
    def family(self) -> str:
        return re.match(r"[a-z]+", self.text).group(0)

    @property
    def unsigned(self) -> bool:
        return " unsigned" in self.text

    @property
    def args(self) -> list[int]:
        found = re.match(r"[a-z]+\(([\d,]+)\)", self.text)
        return [int(a) for a in found.group(1).split(",")] if found else []


def _check(ok: bool, t: ColumnType, value, why: str) -> None:
    # A wrong sample would silently teach the converters a wrong format, so fail loudly here.
    if not ok:
        raise ValueError(f"sample value {value!r} does not fit {t.text}: {why}")


def _integer(t: ColumnType, value, charset: str) -> pb.Data:
    bits, signed, unsigned = _INTEGERS[t.family]
    lo, hi = (0, 2 ** bits - 1) if t.unsigned else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)
    _check(isinstance(value, int) and lo <= value <= hi, t, value, f"outside {lo}..{hi}")
    return pb.Data(dataType=unsigned if t.unsigned else signed, sv=str(value))


def _bit(t: ColumnType, value, charset: str) -> pb.Data:
    _check(0 <= value < 2 ** t.args[0], t, value, "too many bits")
    # BIT is INT64 on the wire; bit(64) values above int64 max cannot be INT64, so they say UINT64.
    return pb.Data(dataType=pb.INT64 if value < 2 ** 63 else pb.UINT64, sv=str(value))


def _year(t: ColumnType, value, charset: str) -> pb.Data:
    _check(value == 0 or 1901 <= value <= 2155, t, value, "YEAR is 0 or 1901..2155")
    return pb.Data(dataType=pb.INT64, sv=str(value))


def _real(data_type: int) -> Callable:
    def encode(t: ColumnType, value, charset: str) -> pb.Data:
        _check(isinstance(value, str) and abs(float(value)) < float("inf"), t, value, "finite text")
        return pb.Data(dataType=data_type, sv=value)
    return encode


def _decimal(t: ColumnType, value, charset: str) -> pb.Data:
    precision, scale = (t.args + [10, 0])[:2] if len(t.args) != 1 else (t.args[0], 0)
    found = re.fullmatch(r"-?(\d+)(?:\.(\d+))?", value)
    _check(bool(found) and len(found.group(2) or "") == scale, t, value, f"needs exactly {scale} decimals")
    _check(len(found.group(1).lstrip("0")) <= precision - scale, t, value, "too many integer digits")
    return pb.Data(dataType=pb.DECIMAL, sv=value)


def _text(t: ColumnType, value, charset: str) -> pb.Data:
    _check(isinstance(value, str), t, value, "text columns take str")
    _check(charset not in ("utf8", "utf8mb3") or all(ord(ch) <= 0xFFFF for ch in value), t, value,
           f"{charset} holds 3-byte UTF-8 only")
    return pb.Data(dataType=pb.STRING, charset=charset, bv=value.encode(CHARSET_CODECS[charset]))


def _binary_text(t: ColumnType, value, charset: str) -> pb.Data:
    # binary(n) is zero-padded to n bytes by MySQL; varbinary(n) holds up to n.
    fits = len(value) == t.args[0] if t.family == "binary" else len(value) <= t.args[0]
    _check(isinstance(value, bytes) and fits, t, value, "wrong length")
    return pb.Data(dataType=pb.STRING, charset="binary", bv=value)


def _temporal(t: ColumnType, value, charset: str) -> pb.Data:
    found = _TEMPORAL[t.family].fullmatch(value)
    fsp = t.args[0] if t.args else 0
    _check(bool(found) and len(found.group(1) or "") == fsp, t, value, f"needs {fsp} fractional digits")
    # whether DTS names a charset on temporal text is not documented: a column may say one (Col.charset)
    return pb.Data(dataType=pb.STRING, charset=charset, bv=value.encode("ascii"))


def _bytes(t: ColumnType, value, charset: str) -> pb.Data:
    raw = value.encode("utf-8") if isinstance(value, str) else value  # json arrives as its text
    _check(isinstance(raw, bytes), t, value, "bytes (or JSON text)")
    return pb.Data(dataType=pb.BYTES, bv=raw)


# MySQL type family -> encoder(type, value, charset) -> Data.
ENCODERS: dict[str, Callable] = {
    **{f: _integer for f in _INTEGERS}, "bit": _bit, "year": _year,
    "float": _real(pb.FLOAT32), "double": _real(pb.FLOAT64), "decimal": _decimal,
    **{f: _text for f in _TEXT}, **{f: _binary_text for f in _BINARY_TEXT},
    **{f: _temporal for f in _TEMPORAL}, **{f: _bytes for f in _BYTES},
}
TEXT_FAMILIES = frozenset(_TEXT)


def encode_value(original_type: str, charset: str, value) -> pb.Data:
    """One column value as DTS puts it in a row image; `charset` matters for text columns only.

    >>> encode_value("varchar(8)", "latin1", "€5").bv
    b'\\x805'
    """
    if value is NULL:
        return pb.Data(dataType=pb.NIL)
    if value is NULL_ON_WIRE:
        return pb.Data(dataType=_NIL_MARK)
    if value is NA:
        return pb.Data(dataType=pb.NA)
    t = ColumnType(original_type)
    return ENCODERS[t.family](t, value, charset)


def mysql_json(doc) -> str:
    """JSON text as MySQL prints a JSON column: `", "` / `": "` separators, unescaped unicode,
    object keys ordered by length, then bytewise (MySQL's binary JSON order)."""
    if isinstance(doc, dict):
        keys = sorted(doc, key=lambda k: (len(k.encode()), k.encode()))
        return "{" + ", ".join(f"{mysql_json(k)}: {mysql_json(doc[k])}" for k in keys) + "}"
    if isinstance(doc, list):
        return "[" + ", ".join(mysql_json(v) for v in doc) + "]"
    if doc is None or isinstance(doc, bool):
        return {None: "null", True: "true", False: "false"}[doc]
    if isinstance(doc, str):
        escaped = doc.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return repr(doc)


def wkb_point(x: float, y: float, srid: int = 0) -> bytes:
    """MySQL's internal geometry value: 4-byte little-endian SRID, then little-endian WKB."""
    return struct.pack("<IBIdd", srid, 1, 1, x, y)


def wkb_polygon(ring: list[tuple[float, float]], srid: int = 0) -> bytes:
    points = b"".join(struct.pack("<dd", x, y) for x, y in ring)
    return struct.pack("<IBIII", srid, 1, 3, 1, len(ring)) + points


# ---- value generators: (RowContext) -> value in the forms encode_value takes --------------------


@dataclass
class RowContext:
    """What a value generator may look at; everything else would make the output vary."""
    rng: random.Random
    n: int      # 1-based number of this row among the generated rows of its table
    now: int    # header time (Unix seconds) of the event that writes the row
    zone: int   # the server's time_zone offset in minutes


Gen = Callable[[RowContext], object]


def serial(start: int = 1) -> Gen:
    return lambda c: start + c.n - 1


def one_of(*values) -> Gen:
    return lambda c: c.rng.choice(values)


def integer(lo: int, hi: int) -> Gen:
    return lambda c: c.rng.randint(lo, hi)


def real(lo: float, hi: float, places: int) -> Gen:
    # repr of a rounded value is the shortest text that parses back, as converters will print it.
    return lambda c: repr(round(c.rng.uniform(lo, hi), places))


def decimal(lo: int, hi: int, scale: int) -> Gen:
    def gen(c: RowContext) -> str:
        units = c.rng.randint(lo * 10 ** scale, hi * 10 ** scale)
        whole, frac = divmod(abs(units), 10 ** scale)
        return ("-" if units < 0 else "") + str(whole) + (f".{frac:0{scale}d}" if scale else "")
    return gen


def words(vocabulary: tuple[str, ...], lo: int, hi: int) -> Gen:
    return lambda c: " ".join(c.rng.choice(vocabulary) for _ in range(c.rng.randint(lo, hi)))


def raw_bytes(lo: int, hi: int) -> Gen:
    return lambda c: c.rng.randbytes(c.rng.randint(lo, hi))


def moment(kind: str = "datetime", fsp: int = 0, within: int = 0) -> Gen:
    """Temporal text `within` seconds before the event, in the server's zone; TIMESTAMP adds it."""
    def gen(c: RowContext) -> str:
        at = _dt.datetime.fromtimestamp(c.now - c.rng.randint(0, within), _dt.timezone.utc)
        at += _dt.timedelta(minutes=c.zone)
        text = at.strftime("%Y-%m-%d" if kind == "date" else "%Y-%m-%d %H:%M:%S")
        if fsp:
            text += "." + str(c.rng.randrange(10 ** fsp)).zfill(fsp)
        if kind == "timestamp":
            text += f" {'+' if c.zone >= 0 else '-'}{abs(c.zone) // 60:02d}:{abs(c.zone) % 60:02d}"
        return text
    return gen


def clock(lo_hours: int = 0, hi_hours: int = 23) -> Gen:
    return lambda c: f"{c.rng.randint(lo_hours, hi_hours):02d}:{c.rng.choice((0, 15, 30, 45)):02d}:00"


def json_doc(make: Callable[[RowContext], object]) -> Gen:
    return lambda c: mysql_json(make(c))


def nullable(gen: Gen, p: float = 0.25, nulls: tuple = (NULL,)) -> Gen:
    """NULL with probability p (one of `nulls`: NULL, NULL_ON_WIRE), else the generator's value."""
    if len(nulls) == 1:  # no second draw: the committed streams keep their random sequence
        return lambda c: nulls[0] if c.rng.random() < p else gen(c)
    return lambda c: c.rng.choice(nulls) if c.rng.random() < p else gen(c)


# ---- columns and tables --------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    """A column declared as data: `Col("id", "bigint(20) unsigned", serial(1), key=True)`."""
    name: str
    type: str               # Column.originalType, as MySQL 5.7 prints it
    gen: Gen
    key: bool = False
    charset: str = ""       # text: empty means the table's charset; temporal: the charset DTS names, if any


@dataclass(frozen=True)
class Table:
    """A table declared as data: its columns in order; rows are dicts keyed by column name."""
    schema: str
    name: str
    cols: tuple[Col, ...]
    charset: str = "utf8mb4"
    engine: str = "InnoDB"

    @property
    def has_key(self) -> bool:
        return any(c.key for c in self.cols)

    def charset_of(self, col: Col) -> str:
        family = ColumnType(col.type).family
        if family in TEXT_FAMILIES:
            return col.charset or self.charset
        return col.charset if family in _TEMPORAL else ""

    def columns(self) -> list[pb.Column]:
        return [pb.Column(name=c.name, originalType=c.type, isKey=c.key) for c in self.cols]

    def encode(self, row: dict) -> list[pb.Data]:
        # Indexing (not .get) so that a row missing a column is a generator bug, not a silent NULL.
        return [encode_value(c.type, self.charset_of(c), row[c.name]) for c in self.cols]

    def with_column(self, col: Col) -> Table:
        return replace(self, cols=self.cols + (col,))

    def create_sql(self) -> str:
        lines = []
        for c in self.cols:
            text = ColumnType(c.type).family in TEXT_FAMILIES
            charset = f" CHARACTER SET {c.charset}" if text and c.charset and c.charset != self.charset else ""
            lines.append(f"  `{c.name}` {c.type}{charset}{' NOT NULL' if c.key else ''}")
        if self.has_key:
            lines.append(f"  PRIMARY KEY ({','.join(f'`{c.name}`' for c in self.cols if c.key)})")
        body = ",\n".join(lines)
        return (f"CREATE TABLE `{self.name}` (\n{body}\n) ENGINE={self.engine} "
                f"DEFAULT CHARSET={self.charset}")


# ---- row changes ---------------------------------------------------------------------------------

FULL, MINIMAL = "FULL", "MINIMAL"  # MySQL binlog_row_image


@dataclass
class Change:
    """One rows event: its table, DML type and (before, after) images; `pieces` > 1 makes DTS
    cut the event into that many Entries (Header.eventIndex 0.., isLast on the last)."""
    table: Table
    kind: int
    images: list[tuple[dict | None, dict | None]]
    pieces: int = 1


def _key_only(table: Table, row: dict) -> dict:
    # MINIMAL before image: the primary key identifies the row; a table without one logs everything.
    return {c.name: row[c.name] if c.key or not table.has_key else NA for c in table.cols}


def insert(table: Table, rows: list[dict], pieces: int = 1) -> Change:
    return Change(table, pb.INSERT, [(None, r) for r in rows], pieces)  # MINIMAL: pass NA for defaults


def update(table: Table, pairs: list[tuple[dict, dict]], image: str = FULL) -> Change:
    if image == MINIMAL:
        pairs = [(_key_only(table, old), {k: v if old[k] != v else NA for k, v in new.items()})
                 for old, new in pairs]
    return Change(table, pb.UPDATE, list(pairs))


def delete(table: Table, rows: list[dict], image: str = FULL) -> Change:
    return Change(table, pb.DELETE, [(_key_only(table, r) if image == MINIMAL else r, None) for r in rows])


# Text in each charset, chosen for the bytes that catch a wrong codec.
TEXTS = {
    "utf8mb4": "emoji 👍🏽 𝄞 中文 Ünïcödé",       # 4-byte UTF-8 sequences
    "utf8": "Ünïcödé ☃ 中文 ✓",                  # 3 bytes at most (utf8 is utf8mb3)
    "utf8mb3": "Ŝpëçîål ✓ 日本語",
    "latin1": "€ 5 Ÿ œ ß é ‰ “quoted” – ok",       # cp1252: € is 0x80, not valid ISO-8859-1
    "gbk": "中文汉字 简体 ＡＢＣ",
    "gb18030": "𠀀 😀 € 中文",                   # 4-byte GB18030 sequences
    "big5": "繁體中文 測試 臺灣",
}

_ALL_BYTES = bytes(range(256))
_JSON_DOC = mysql_json({"id": 1, "name": "张三 😀", "tags": ["a", "b\"c", "\\"], "price": 19.99,
                        "active": True, "nested": {"k": None, "list": [1, 2.5, -3]}})

# all_types rows: the extremes of every type. Columns left out take their NULL-row value.
ALL_TYPES_EDGE_ROWS: list[dict] = [
    {"id": 1, "c_tinyint": -128, "c_tinyint_u": 0, "c_bool": 0, "c_smallint": -32768, "c_smallint_u": 0,
     "c_mediumint": -8388608, "c_mediumint_u": 0, "c_int": -2147483648, "c_int_u": 0,
     "c_bigint": -9223372036854775808, "c_bigint_u": 0, "c_float": "-3.4028235e+38",
     "c_double": "-1.7976931348623157e+308", "c_decimal": "-999999999999999999999.999999999",
     "c_money": "-99999999.99", "c_bit1": 0, "c_bit8": 0, "c_bit64": 0, "c_year": 1901,
     "c_date": "1000-01-01", "c_datetime": "1000-01-01 00:00:00", "c_datetime6": "1000-01-01 00:00:00.000000",
     "c_timestamp": "1970-01-01 00:00:01 +00:00", "c_timestamp3": "1970-01-01 08:00:01.000 +08:00",
     "c_time": "-838:59:59", "c_time3": "-838:59:59.000", "c_char": "a", "c_varchar": "a",
     "c_tinytext": "a", "c_text": "a", "c_mediumtext": "a", "c_longtext": "a", "c_enum": "draft",
     "c_set": "red", "c_binary": bytes(15) + b"\x01", "c_varbinary": b"\x00", "c_tinyblob": b"\x00",
     "c_blob": b"\x00", "c_mediumblob": b"\x00", "c_longblob": b"\x00", "c_json": "null",
     "c_geometry": wkb_point(-180.0, -90.0, 4326)},
    {"id": 2, "c_tinyint": 127, "c_tinyint_u": 255, "c_bool": 1, "c_smallint": 32767, "c_smallint_u": 65535,
     "c_mediumint": 8388607, "c_mediumint_u": 16777215, "c_int": 2147483647, "c_int_u": 4294967295,
     "c_bigint": 9223372036854775807, "c_bigint_u": 18446744073709551615, "c_float": "3.4028235e+38",
     "c_double": "1.7976931348623157e+308", "c_decimal": "999999999999999999999.999999999",
     "c_money": "99999999.99", "c_bit1": 1, "c_bit8": 255, "c_bit64": 18446744073709551615,
     "c_year": 2155, "c_date": "9999-12-31", "c_datetime": "9999-12-31 23:59:59",
     "c_datetime6": "9999-12-31 23:59:59.999999", "c_timestamp": "2038-01-19 03:14:07 +00:00",
     "c_timestamp3": "2038-01-19 11:14:07.999 +08:00", "c_time": "838:59:59", "c_time3": "838:59:59.000",
     "c_char": "ＡＢＣ😀", "c_varchar": TEXTS["utf8mb4"], "c_tinytext": "☃" * 85, "c_text": TEXTS["utf8mb4"] * 4,
     "c_mediumtext": "\t\n\r\\\"'%_\x00", "c_longtext": "line1\nline2\r\n" + TEXTS["utf8mb4"],
     "c_enum": "archived", "c_set": "red,green,blue", "c_binary": b"\xff" * 16,
     "c_varbinary": bytes(range(255)), "c_tinyblob": bytes(range(255, 0, -1)), "c_blob": _ALL_BYTES,
     "c_mediumblob": _ALL_BYTES[::-1], "c_longblob": _ALL_BYTES * 2, "c_json": _JSON_DOC,
     "c_geometry": wkb_polygon([(0, 0), (10, 0), (10, 10), (0, 10), (0, 0)])},
    {"id": 3, "c_tinyint": -1, "c_tinyint_u": 1, "c_bool": 1, "c_smallint": -1, "c_smallint_u": 1,
     "c_mediumint": -1, "c_mediumint_u": 1, "c_int": -1, "c_int_u": 1, "c_bigint": -1, "c_bigint_u": 1,
     "c_float": "1e-45", "c_double": "5e-324", "c_decimal": "-0.000000001", "c_money": "0.01",
     "c_bit1": 1, "c_bit8": 1, "c_bit64": 9223372036854775807, "c_year": 2021, "c_date": "2021-05-17",
     "c_datetime": "2021-05-17 07:22:42", "c_datetime6": "2021-05-17 07:22:42.123456",
     "c_timestamp": "2021-05-17 12:52:42 +05:30", "c_timestamp3": "2021-05-17 00:22:42.123 -07:00",
     "c_time": "-12:00:00", "c_time3": "20:12:22.500", "c_char": "中", "c_varchar": " leading and trailing ",
     "c_tinytext": "x", "c_text": "x", "c_mediumtext": "x", "c_longtext": "x", "c_enum": "published",
     "c_set": "green", "c_binary": bytes.fromhex("0f1e2d3c4b5a69788796a5b4c3d2e1f0"),
     "c_varbinary": b"\xc3\x28 not utf-8 \xff", "c_tinyblob": b"x", "c_blob": b"x", "c_mediumblob": b"x",
     "c_longblob": b"x", "c_json": mysql_json(["天", 1, True, None, {"a": []}]),
     "c_geometry": wkb_point(116.397128, 39.916527, 4326)},
    # Zero values and empty strings: not NULL, and zero dates are legal MySQL data.
    {"id": 4, **{c: 0 for c in ("c_tinyint", "c_tinyint_u", "c_bool", "c_smallint", "c_smallint_u",
                                 "c_mediumint", "c_mediumint_u", "c_int", "c_int_u", "c_bigint",
                                 "c_bigint_u", "c_bit1", "c_bit8", "c_bit64", "c_year")},
     "c_float": "-0.0", "c_double": "-0.0", "c_decimal": "0.000000000", "c_money": "0.00",
     "c_date": "0000-00-00", "c_datetime": "0000-00-00 00:00:00", "c_datetime6": "0000-00-00 00:00:00.000000",
     "c_timestamp": "0000-00-00 00:00:00 +00:00", "c_timestamp3": "0000-00-00 00:00:00.000 +00:00",
     "c_time": "00:00:00", "c_time3": "00:00:00.000", "c_char": "", "c_varchar": "", "c_tinytext": "",
     "c_text": "", "c_mediumtext": "", "c_longtext": "", "c_enum": "", "c_set": "", "c_binary": bytes(16),
     "c_varbinary": b"", "c_tinyblob": b"", "c_blob": b"", "c_mediumblob": b"", "c_longblob": b"",
     "c_json": "{}", "c_geometry": wkb_point(0.0, 0.0)},
    {"id": 5},  # every other column NULL
    {"id": 4294967295, "c_float": "1.1754944e-38", "c_double": "2.2250738585072014e-308",
     "c_decimal": "123456789012345678901.123456789", "c_time": "-00:00:01", "c_time3": "-00:00:00.001",
     "c_datetime6": "2021-05-17 07:22:42.000001", "c_timestamp": "2021-05-17 15:22:42 +08:00",
     "c_timestamp3": "2021-05-17 07:22:42.999 +00:00", "c_json": mysql_json("a JSON string, not an object"),
     "c_text": TEXTS["utf8"], "c_bit64": 9223372036854775808},
]

# charsets rows: the same idea in every charset, then empty strings, then NULLs.
CHARSET_EDGE_ROWS: list[dict] = [
    {"id": 1, **{f"c_{cs}": TEXTS[cs] for cs in TEXTS}, "c_gbk_char": "中文", "c_latin1_text": "€" * 100},
    {"id": 2, **{f"c_{cs}": "" for cs in TEXTS}, "c_gbk_char": "", "c_latin1_text": ""},
    {"id": 3},
]


# ---- the shapes a real subscription carries (docs/performance.md, "Value shapes (h)") ------------
# What Tencent's documentation and public consumers show DTS sending, one column per shape: text as
# STRING with charset utf8/utf8mb4/gbk/latin1 in `bv`; temporals as STRING, with a charset and
# without; TIMESTAMP as "... +00:00"; DATETIME(6); NULL as an empty Data and as NIL written out;
# numbers in `sv` ("1" for a double); BIT and YEAR as integers; JSON/BLOB/GEOMETRY as BYTES; zero dates.

_BUYERS = ("王伟", "李芳 🌸", "Zoë Müller", "José García", "Nguyễn Văn A", "O'Brien")
_SUPPLIERS = ("华东供应链有限公司", "深圳市电子元件厂", "北京图书批发", "广州服装（集团）")


def _zero_or(gen: Gen, p: float, zero: str) -> Gen:
    """MySQL's zero date with probability p (legal with the default sql_mode of 5.x), else gen's value."""
    return lambda c: zero if c.rng.random() < p else gen(c)


REAL_ORDERS = Table("mall", "orders", (
    Col("id", "bigint(20) unsigned", serial(880001), key=True),
    Col("buyer", "varchar(64)", one_of(*_BUYERS)),                                     # utf8mb4 (the table's)
    Col("city", "varchar(32)", one_of("Zürich", "北京", "São Paulo", "Kraków"), charset="utf8"),
    Col("supplier", "varchar(64)", one_of(*_SUPPLIERS), charset="gbk"),
    Col("note", "varchar(255)", nullable(one_of("€ 5 off", "naïve café", "Œuvre – “quoted”"), 0.3,
                                         (NULL, NULL_ON_WIRE)), charset="latin1"),
    Col("amount", "decimal(12,2)", decimal(1, 9999, 2)),
    Col("weight", "double", one_of("1", "2.5", "0.125", "12")),               # "1" for 1.0, as DTS writes it
    Col("qty", "int(11)", integer(1, 50)),
    Col("flags", "bit(8)", integer(0, 255)),
    Col("model_year", "year(4)", integer(1990, 2021)),
    Col("ordered_on", "date", moment("date", within=30 * 86400), charset="utf8mb4"),
    Col("created_at", "datetime", moment("datetime", within=600), charset="utf8mb4"),
    Col("paid_at", "datetime(6)", nullable(moment("datetime", 6, within=600), 0.2, (NULL, NULL_ON_WIRE))),
    Col("updated_at", "timestamp", moment("timestamp"), charset="binary"),
    Col("synced_at", "timestamp(3)", moment("timestamp", 3)),
    Col("shipped_on", "date", _zero_or(moment("date", within=86400), 0.4, "0000-00-00")),
    Col("closed_at", "datetime", _zero_or(moment("datetime", within=86400), 0.3, "0000-00-00 00:00:00")),
    Col("attrs", "json", json_doc(lambda c: {"gift": c.rng.random() < 0.3, "tags": ["促销", "vip"][:c.n % 3]})),
    Col("receipt", "blob", nullable(raw_bytes(4, 24), 0.3, (NULL, NULL_ON_WIRE))),
    Col("location", "geometry", lambda c: wkb_point(c.rng.randint(73, 135) + 0.5, c.rng.randint(18, 53) + 0.25, 4326)),
))

REAL_SUPPLIERS = Table("mall", "suppliers", (   # a gbk table: every text column gbk
    Col("id", "int(11)", serial(1), key=True),
    Col("name", "varchar(64)", one_of(*_SUPPLIERS)),
    Col("contact", "varchar(32)", one_of("张经理", "李女士", "陈先生")),
    Col("address", "varchar(128)", one_of("上海市浦东新区世纪大道100号", "广东省深圳市南山区科技园")),
    Col("rating", "decimal(3,1)", decimal(0, 5, 1)),
    Col("joined_on", "date", _zero_or(moment("date", within=10 ** 8), 0.25, "0000-00-00")),
), charset="gbk")

# Header properties a producer may tag Entries with; the keys are the generator's (DTS documents none).
REAL_PROPERTIES = (("subscribe_id", "subs-7x9k2m"), ("region", "ap-guangzhou"))


def realistic_rows(count: int, seed: int = 0, table: Table = REAL_ORDERS, now: int = 1621236162):
    """`count` rows of `table` (default: REAL_ORDERS, one column per documented shape) in the forms
    `Table.encode` takes; deterministic for a seed."""
    rng = random.Random(seed)
    for n in range(1, count + 1):
        ctx = RowContext(rng, n, now + n // 10, 0)
        yield {c.name: c.gen(ctx) for c in table.cols}


def realistic_entries(count: int, seed: int = 0, rows_per_entry: int = 1, table: Table = REAL_ORDERS,
                      properties: tuple = REAL_PROPERTIES) -> list[bytes]:
    """The wire bytes of `count` INSERT Entries of `table`, `rows_per_entry` rows each, as DTS writes
    them (header properties, NULLs both ways, the shapes of REAL_ORDERS): the benchmarks' realistic
    mix. Parse one with `pb.Entry.FromString`; `samples/realistic.pb` holds the same shapes.

    >>> [len(pb.Entry.FromString(raw).event.dmlEvent.rows) for raw in realistic_entries(2, rows_per_entry=3)]
    [3, 3]
    """
    rows = realistic_rows(count * rows_per_entry, seed, table)
    out = []
    for seq in range(1, count + 1):
        header = pb.Header(version=1, sourceType=pb.MYSQL, messageType=pb.DML, timestamp=1621236162 + seq // 10,
                           serverId=3306101, fileName="mysql-bin.000031", position=4 + 512 * seq,
                           gtid=f"7d2c4e1a-3b9f-11ec-9a41-5254006a1c2f:{seq}", schemaName=table.schema,
                           tableName=table.name, seqId=seq, isLast=True,
                           properties=[pb.KVPair(key=k, value=v) for k, v in properties])
        event = pb.DMLEvent(dmlEventType=pb.INSERT, columns=table.columns())
        for _ in range(rows_per_entry):
            event.rows.add(newColumns=table.encode(next(rows)))
        out.append(wire_bytes(pb.Entry(header=header, event=pb.Event(dmlEvent=event))))
    return out
