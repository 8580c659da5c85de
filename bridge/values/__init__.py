"""Every mapping table of the bridge, and the per-column value codecs built from them.

The tables (each a module-level dict, each checked by a test for completeness):
`OPS_BY_MESSAGE_TYPE` (MessageType -> op), `DML_OPS` (DMLType -> ops), `DDL_OPS` (leading keywords ->
op), `SOURCE_TYPES` (SourceType -> dbType), `CHARSETS` (MySQL charset -> Python codec),
`FAMILIES` (MySQL type family -> kind), `KIND_DATATYPES` (kind -> canonical DataType) and `CODECS`
(kind -> value codec factory).

A codec converts one `Data` to its Blob value and back. `to_blob(data)` returns the value when
the Blob value gives back exactly the same `Data`; otherwise it raises `Inexact(best, reason)`,
`best` being the closest Blob value or None; the row codec then carries the raw Data in the
lossless extension or reports the reason (strict mode). `from_blob(value)` rebuilds the canonical
`Data`.

>>> t = parse_column_type("bigint(20) unsigned")
>>> (t.family, t.unsigned, t.kind, blob_type(t))
('bigint', True, 'integer', 'STRING')
>>> ddl_op("/* x */ create   TABLE `t` (id int)")
'CREATE'
"""
from __future__ import annotations

import base64
import codecs
import datetime as _dt
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from typing import Any

from bridge.errors import ConversionError
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.wire import subscribe_pb2 as pb

DT = pb.DataType
# Plain ints: attribute access on protobuf's enum wrappers is slow in hot loops.
NIL, NA, STRING, BYTES, DECIMAL_DT = int(DT.NIL), int(DT.NA), int(DT.STRING), int(DT.BYTES), int(DT.DECIMAL)
DEFAULT_CHARSET = "utf8mb4"  # text whose charset the Blob side does not name
RESERVED_PREFIX = "datahub:"  # DTS property keys the bridge owns (DataHub-only facts)
BLOB_TYPES = ("BOOLEAN", "DOUBLE", "DATE", "BYTES", "LONG", "STRING")

# ---- MessageType / DMLType / DDL / SourceType -> DataHub words -------------------------------

# None: the op depends on the event (DML, DDL); CHECKPOINT and ROLLBACK travel only in lossless mode.
OPS_BY_MESSAGE_TYPE: dict[int, str | None] = {
    pb.BEGIN: "TRANSACTION_BEGIN",
    pb.COMMIT: "TRANSACTION_END",
    pb.DML: None,
    pb.DDL: None,
    pb.ROLLBACK: "XAROLLBACK",
    pb.HEARTBEAT: "MHEARTBEAT",
    pb.CHECKPOINT: "GTID",
}
CONTROL_MESSAGE_TYPES = frozenset({pb.ROLLBACK, pb.CHECKPOINT})

DML_OPS: dict[int, tuple[str, ...]] = {
    pb.INSERT: ("INSERT",),
    pb.UPDATE: ("UPDATE_BEFOR", "UPDATE_AFTER"),
    pb.DELETE: ("DELETE",),
}

# Leading keywords (upper case, single spaces) -> op; the longest matching prefix wins.
DDL_OPS: dict[str, str] = {
    "CREATE TABLE": "CREATE",
    "CREATE TEMPORARY TABLE": "CREATE",
    "CREATE OR REPLACE TABLE": "CREATE",
    "CREATE OR REPLACE TEMPORARY TABLE": "CREATE",
    "ALTER TABLE": "ALTER",
    "ALTER ONLINE TABLE": "ALTER",
    "ALTER IGNORE TABLE": "ALTER",
    "DROP TABLE": "ERASE",
    "DROP TEMPORARY TABLE": "ERASE",
    "TRUNCATE": "TRUNCATE",
    "TRUNCATE TABLE": "TRUNCATE",
    "RENAME TABLE": "RENAME",
    "CREATE INDEX": "CINDEX",
    "CREATE UNIQUE INDEX": "CINDEX",
    "CREATE FULLTEXT INDEX": "CINDEX",
    "CREATE SPATIAL INDEX": "CINDEX",
    "CREATE ONLINE INDEX": "CINDEX",
    "CREATE OR REPLACE INDEX": "CINDEX",
    "CREATE OR REPLACE UNIQUE INDEX": "CINDEX",
    "CREATE OR REPLACE FULLTEXT INDEX": "CINDEX",
    "CREATE OR REPLACE SPATIAL INDEX": "CINDEX",
    "DROP INDEX": "DINDEX",
    "DROP ONLINE INDEX": "DINDEX",
}
DDL_DEFAULT_OP = "QUERY"
DDL_OP_NAMES = frozenset(DDL_OPS.values()) | {DDL_DEFAULT_OP}

SOURCE_TYPES: dict[int, str] = {
    pb.ORACLE: "Oracle",
    pb.MYSQL: "MySQL",
    pb.PGSQL: "PostgreSQL",
    pb.MARIADB: "MariaDB",
}
SOURCE_TYPES_BY_NAME = {v.lower(): k for k, v in SOURCE_TYPES.items()}

_COMMENTS = re.compile(r"\s+|/\*(?!!).*?\*/|--[^\n]*(?:\n|$)|#[^\n]*(?:\n|$)", re.S)
_EXEC_COMMENT = re.compile(r"/\*!\d*\s*")
_WORD = re.compile(r"[A-Za-z_]+")
_DDL_PREFIX_WORDS = max(len(k.split()) for k in DDL_OPS)


def ddl_op(sql: str) -> str:
    """The op of a DDL statement from its leading keywords, after comments and whitespace.

    MySQL's executable comments (`/*!40101 ALTER TABLE ... */`) count as the statement they hold.
    """
    pos, n = 0, len(sql)
    while pos < n:
        m = _COMMENTS.match(sql, pos)
        if m and m.end() > pos:
            pos = m.end()
            continue
        m = _EXEC_COMMENT.match(sql, pos)
        if m:
            pos = m.end()
            continue
        break
    words = []
    while pos < n and len(words) < _DDL_PREFIX_WORDS:
        m = _WORD.match(sql, pos)
        if not m:
            break
        words.append(m.group().upper())
        pos = m.end()
        while pos < n:
            c = _COMMENTS.match(sql, pos)
            if not c or c.end() == pos:
                break
            pos = c.end()
    for size in range(len(words), 0, -1):
        op = DDL_OPS.get(" ".join(words[:size]))
        if op:
            return op
    return DDL_DEFAULT_OP


# ---- charsets ---------------------------------------------------------------------------------

def _mysql_latin1() -> codecs.CodecInfo:
    # MySQL's latin1 is cp1252 with the five bytes cp1252 leaves undefined mapped to C1 controls,
    # so every byte decodes and re-encodes to itself.
    table = "".join(bytes([b]).decode("cp1252", errors="ignore") or chr(b) for b in range(256))
    enc = codecs.charmap_build(table)
    return codecs.CodecInfo(name="mysql-latin1",
                            encode=lambda s, errors="strict": codecs.charmap_encode(s, errors, enc),
                            decode=lambda b, errors="strict": codecs.charmap_decode(b, errors, table))


MYSQL_LATIN1 = _mysql_latin1()

# MySQL charset -> Python codec name; None for `binary` (bytes, never text). MySQL charsets with no
# exact Python equivalent (armscii8, dec8, geostd8, hp8, keybcs2, swe7, eucjpms) are left out on
# purpose: decoding them with a near relative would silently change characters.
CHARSETS: dict[str, str | None] = {
    "": "utf-8",
    "utf8": "utf-8", "utf8mb3": "utf-8", "utf8mb4": "utf-8",
    "ascii": "ascii",
    "latin1": "mysql-latin1",
    "latin2": "iso8859_2", "latin5": "iso8859_9", "latin7": "iso8859_13",
    "cp1250": "cp1250", "cp1251": "cp1251", "cp1256": "cp1256", "cp1257": "cp1257",
    "cp850": "cp850", "cp852": "cp852", "cp866": "cp866", "cp932": "cp932",
    "greek": "iso8859_7", "hebrew": "iso8859_8",
    "koi8r": "koi8_r", "koi8u": "koi8_u",
    "macce": "mac_latin2", "macroman": "mac_roman",
    "gbk": "gbk", "gb2312": "gb2312", "gb18030": "gb18030",
    "big5": "big5", "euckr": "euc_kr", "sjis": "shift_jis", "ujis": "euc_jp", "tis620": "tis_620",
    "ucs2": "utf-16-be", "utf16": "utf-16-be", "utf16le": "utf-16-le", "utf32": "utf-32-be",
    "binary": None,
}
_IDENTITY_CODECS = frozenset({"utf-8", "ascii", "mysql-latin1"})  # decode then encode is the identity


@cache
def charset_codec(charset: str):
    """(decode, encode, needs_check) for a MySQL charset name, or None when it has no text codec."""
    name = CHARSETS.get(charset.lower(), "?")
    if name is None or name == "?":
        return None
    info = MYSQL_LATIN1 if name == "mysql-latin1" else codecs.lookup(name)
    return info.decode, info.encode, name not in _IDENTITY_CODECS


# ---- MySQL column types -----------------------------------------------------------------------

# family -> kind; a kind decides the Blob type, the canonical DataType and the codec.
FAMILIES: dict[str, str] = {
    "tinyint": "integer", "smallint": "integer", "mediumint": "integer", "int": "integer",
    "integer": "integer", "bigint": "integer",
    "bit": "bit", "year": "year", "bool": "integer", "boolean": "integer",
    "float": "float", "double": "float", "real": "float", "double precision": "float",
    "decimal": "decimal", "numeric": "decimal", "dec": "decimal", "fixed": "decimal",
    "char": "text", "varchar": "text", "tinytext": "text", "text": "text", "mediumtext": "text",
    "longtext": "text", "enum": "text", "set": "text", "nchar": "text", "nvarchar": "text",
    "binary": "binary", "varbinary": "binary",
    "tinyblob": "bytes", "blob": "bytes", "mediumblob": "bytes", "longblob": "bytes",
    "geometry": "bytes", "point": "bytes", "linestring": "bytes", "polygon": "bytes",
    "multipoint": "bytes", "multilinestring": "bytes", "multipolygon": "bytes",
    "geometrycollection": "bytes", "geomcollection": "bytes",
    "json": "json",
    "date": "date", "datetime": "datetime", "timestamp": "timestamp", "time": "time",
    "boolean-from-datahub": "boolean",
}

INT_WIDTHS = {"tinyint": 8, "bool": 8, "boolean": 8, "smallint": 16, "mediumint": 24, "int": 32,
              "integer": 32, "bigint": 64}
_SIGNED_DT = {8: DT.INT8, 16: DT.INT16, 24: DT.INT32, 32: DT.INT32, 64: DT.INT64}
_UNSIGNED_DT = {8: DT.UINT8, 16: DT.UINT16, 24: DT.UINT32, 32: DT.UINT32, 64: DT.UINT64}

# kind -> the DataType a canonical DTS value of that kind has (integer: by width and sign).
KIND_DATATYPES: dict[str, int | None] = {
    "integer": None, "bit": DT.INT64, "year": DT.INT64, "boolean": DT.INT8,
    "float": None, "decimal": DT.DECIMAL, "text": DT.STRING, "binary": DT.STRING,
    "bytes": DT.BYTES, "json": DT.BYTES, "date": DT.STRING, "datetime": DT.STRING,
    "timestamp": DT.STRING, "time": DT.STRING,
}

# Property key on a Column that marks a DataHub BOOLEAN carried as tinyint(1).
BOOLEAN_PROPERTY = RESERVED_PREFIX + "type"

# Blob type of a foreign column (no 'dts' extension) -> (originalType, Column properties) of its DTS column.
FOREIGN_COLUMN_TYPES: dict[str, tuple[str, tuple]] = {
    "LONG": ("bigint(20)", ()),
    "DOUBLE": ("double", ()),
    "BOOLEAN": ("tinyint(1)", ((BOOLEAN_PROPERTY, "BOOLEAN"),)),
    "STRING": ("longtext", ()),
    "BYTES": ("longblob", ()),
    "DATE": ("datetime(3)", ()),
}

_TYPE_RE = re.compile(r"^\s*([a-zA-Z][a-zA-Z ]*?)\s*(?:\((.*)\))?\s*((?:\s*(?:unsigned|signed|zerofill))*)\s*$",
                      re.S)


@dataclass(frozen=True)
class ColumnType:
    """A parsed `Column.originalType`: family, sign, length/precision, scale/fsp."""
    text: str
    family: str
    kind: str
    unsigned: bool = False
    length: int | None = None
    scale: int | None = None

    @property
    def fsp(self) -> int:
        """Fractional-second digits of a temporal type (its declared precision)."""
        return self.length or 0

    @property
    def int_range(self) -> tuple[int, int]:
        bits = 64 if self.kind == "bit" else INT_WIDTHS.get(self.family, 64)
        if self.kind == "bit":
            return 0, (1 << (self.length or 1)) - 1
        if self.unsigned:
            return 0, (1 << bits) - 1
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def canonical_datatype(self, value: int | None = None) -> int:
        if self.kind == "integer":
            bits = INT_WIDTHS.get(self.family, 64)
            return (_UNSIGNED_DT if self.unsigned else _SIGNED_DT)[bits]
        if self.kind == "float":
            return DT.FLOAT32 if self.family == "float" else DT.FLOAT64
        if self.kind == "bit" and value is not None and value > (1 << 63) - 1:
            return DT.UINT64
        return KIND_DATATYPES[self.kind]


@lru_cache(maxsize=4096)
def parse_column_type(text: str, boolean: bool = False) -> ColumnType:
    """Parse a MySQL column type as MySQL prints it (`decimal(30,9)`, `int(10) unsigned`, ...)."""
    m = _TYPE_RE.match(text)
    family = " ".join(m.group(1).lower().split()) if m else ""
    kind = FAMILIES.get(family)
    if kind is None:
        raise ConversionError("unknown MySQL column type", value=text)
    if boolean:
        kind = "boolean"
    args = m.group(2)
    length = scale = None
    if args and family not in ("enum", "set"):
        parts = [p.strip() for p in args.split(",")]
        try:
            length = int(parts[0])
            scale = int(parts[1]) if len(parts) > 1 else None
        except ValueError:
            raise ConversionError("unparsable MySQL column type arguments", value=text) from None
    if kind == "decimal" and length is None:
        length, scale = 10, 0
    if kind == "decimal" and scale is None:
        scale = 0
    return ColumnType(text=text, family=family, kind=kind, unsigned="unsigned" in m.group(3).lower(),
                      length=length, scale=scale)


def blob_type(ct: ColumnType, options: Options = DEFAULT_OPTIONS) -> str:
    """The Blob value type of a column, decided by its definition, never by one row's value."""
    kind = ct.kind
    if kind == "integer":
        return "STRING" if ct.unsigned and INT_WIDTHS.get(ct.family) == 64 else "LONG"
    if kind == "bit":
        return "STRING" if (ct.length or 1) >= 64 else "LONG"
    if kind == "decimal":
        return "DOUBLE" if options.decimal == "double" else "STRING"
    return BLOB_KIND_TYPES[kind]


BLOB_KIND_TYPES: dict[str, str] = {
    "integer": "LONG", "bit": "LONG", "year": "LONG", "boolean": "BOOLEAN", "float": "DOUBLE",
    "decimal": "STRING", "text": "STRING", "binary": "BYTES", "bytes": "BYTES", "json": "STRING",
    "date": "DATE", "datetime": "DATE", "timestamp": "DATE", "time": "STRING",
}


# ---- value codecs -----------------------------------------------------------------------------

class Inexact(Exception):
    """The Blob value cannot give back the exact Data: `best` is the closest value (or None)."""

    def __init__(self, best: Any, reason: str, changed: bool = True) -> None:
        super().__init__(reason)
        self.best = best
        self.reason = reason
        # False: `best` is the same value, only its DTS spelling is not the canonical one, so strict
        # mode may emit it; True: the Blob value would differ from the DTS value.
        self.changed = changed


class Substituted(Inexact):
    """A temporal policy (Options.zero_dates, Options.temporal_precision) writes `best` in place of
    the value `text`: strict Blob and Tuple emit it, and the stream layer counts it by `kind` (a
    `SUBSTITUTIONS` key) and records it in the loss ledger (`note_substitution`)."""

    def __init__(self, best: Any, reason: str, kind: str, text: str) -> None:
        super().__init__(best, reason, changed=False)
        self.kind = kind
        self.text = text


# What a temporal policy substitutes: kind (a stream.Tally field) -> what the run's summary says.
SUBSTITUTIONS: dict[str, str] = {
    "zero_dates": "zero or invalid dates written as null",
    "fractions": "sub-millisecond fractions truncated or rounded",
    "out_of_range": "dates beyond DataHub's TIMESTAMP range written as null",
}

class _Notes(threading.local):
    """`notes`: the substitutions of the record this thread is converting, (kind, column, value as
    sent, value written), or None. The stream layer sets a list around each converter call (one
    attribute store each way: cheaper per Entry than a ContextVar's set and reset) and counts it
    only once the record converted whole (`stream.counted`)."""
    notes: list | None = None


SUBSTITUTION_NOTES = _Notes()


def discard_substitutions() -> None:
    """Forget what the record being converted substituted: its conversion failed, and a caller
    turns the failure into an output of its own (sync's dead letter), so it is not converted."""
    notes = SUBSTITUTION_NOTES.notes
    if notes:
        notes.clear()


def note_substitution(found: Substituted, column: str) -> None:
    """Record one substitution where the converter used it (a value converted twice, first by a
    fast path that gave way, is noted once: only its user notes it)."""
    notes = SUBSTITUTION_NOTES.notes
    if notes is not None:
        notes.append((found.kind, column, found.text, found.best))


_INT_RE = re.compile(r"-?[0-9]+\Z")
_DEC_RE = re.compile(r"-?[0-9]+(?:\.[0-9]+)?\Z")
_FLOAT_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\Z")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


def _text_of(d: pb.Data) -> str:
    """The ASCII text of a temporal value (bv, or sv when a producer put it there)."""
    if d.bv:
        return d.bv.decode("utf-8")
    return d.sv


@dataclass
class Codec:
    """Converts values of one column to Blob values and back (see the module docstring)."""
    ct: ColumnType
    blob_type: str
    to_blob: Callable[[pb.Data], Any]
    from_blob: Callable[[Any, str], pb.Data]  # (value, charset) -> Data


def _integer_codec(ct: ColumnType, options: Options) -> Codec:
    lo, hi = ct.int_range
    as_text = blob_type(ct, options) == "STRING"
    fixed_dt = None if ct.kind == "bit" else ct.canonical_datatype()

    def to_blob(d: pb.Data):
        sv = d.sv
        try:
            v = int(sv)
        except ValueError:
            raise ConversionError("not an integer", value=sv) from None
        if str(v) != sv:
            if not _INT_RE.match(sv):
                raise ConversionError("not an integer", value=sv)
        elif lo <= v <= hi and d.dataType == (fixed_dt or ct.canonical_datatype(v)) and not (d.charset or d.bv):
            return sv if as_text else v
        if not lo <= v <= hi:
            if as_text or _LONG_MIN <= v <= _LONG_MAX:
                raise Inexact(str(v) if as_text else v, f"integer outside the range of {ct.text}")
            raise Inexact(None, f"integer outside the signed 64-bit range of LONG ({ct.text})")
        raise Inexact(str(v) if as_text else v, "non-canonical integer", changed=False)

    def from_blob(value, charset=""):
        if as_text:
            if not isinstance(value, str) or not _INT_RE.match(value):
                raise ConversionError(f"{ct.text} value must be a string of digits", value=value)
            v = int(value)
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConversionError("LONG value must be an integer", value=value)
            v = value
        return pb.Data(dataType=ct.canonical_datatype(v), sv=str(v))

    return Codec(ct, "STRING" if as_text else "LONG", to_blob, from_blob)


def _boolean_codec(ct: ColumnType, options: Options) -> Codec:
    def to_blob(d: pb.Data):
        if d.sv not in ("0", "1") or d.dataType != DT.INT8 or d.charset or d.bv:
            raise Inexact(None, "BOOLEAN column value is not 0 or 1")
        return d.sv == "1"

    def from_blob(value, charset=""):
        if not isinstance(value, bool):
            raise ConversionError("BOOLEAN value must be true or false", value=value)
        return pb.Data(dataType=DT.INT8, sv="1" if value else "0")

    return Codec(ct, "BOOLEAN", to_blob, from_blob)


def _float_codec(ct: ColumnType, options: Options) -> Codec:
    dt = ct.canonical_datatype()

    def to_blob(d: pb.Data):
        sv = d.sv
        if not _FLOAT_RE.match(sv):
            if sv.lower().lstrip("+-") in ("nan", "inf", "infinity"):
                raise Inexact(None, "non-finite float has no JSON value")
            raise ConversionError("not a number", value=sv)
        v = float(sv)
        if v in (float("inf"), float("-inf")):
            raise Inexact(None, "float overflows a double")
        if repr(v) != sv or d.dataType != dt or d.charset or d.bv:
            raise Inexact(v, "non-canonical float text", changed=False)
        return v

    def from_blob(value, charset=""):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConversionError("DOUBLE value must be a number", value=value)
        return pb.Data(dataType=dt, sv=repr(float(value)))

    return Codec(ct, "DOUBLE", to_blob, from_blob)


def _decimal_codec(ct: ColumnType, options: Options) -> Codec:
    scale = ct.scale or 0
    as_double = options.decimal == "double"

    def to_blob(d: pb.Data):
        sv = d.sv
        if not _DEC_RE.match(sv):
            raise ConversionError("not a decimal number", value=sv)
        if as_double:
            v = float(sv)
            if f"{v:.{scale}f}" != sv:
                raise Inexact(v, "decimal does not fit a double exactly")
        else:
            v = sv
        if d.dataType != DECIMAL_DT or d.charset or d.bv:
            raise Inexact(v, "non-canonical decimal", changed=False)
        return v

    def from_blob(value, charset=""):
        if as_double:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConversionError("DOUBLE value must be a number", value=value)
            return pb.Data(dataType=DT.DECIMAL, sv=f"{float(value):.{scale}f}")
        if not isinstance(value, str) or not _DEC_RE.match(value):
            raise ConversionError("decimal value must be a string of digits", value=value)
        return pb.Data(dataType=DECIMAL_DT, sv=value)

    return Codec(ct, "DOUBLE" if as_double else "STRING", to_blob, from_blob)


def _text_codec(ct: ColumnType, options: Options) -> Codec:
    def to_blob(d: pb.Data):
        codec = charset_codec(d.charset)
        if codec is None:
            raise Inexact(None, f"charset {d.charset!r} has no text decoding")
        decode, encode, check = codec
        try:
            text = decode(d.bv)[0]
        except UnicodeDecodeError as exc:
            raise Inexact(None, f"bytes do not decode as {d.charset or 'utf8'} ({exc.reason} at byte {exc.start})")
        if check and encode(text)[0] != d.bv:
            raise Inexact(text, f"text does not re-encode to the same {d.charset} bytes", changed=False)
        if d.dataType != STRING or d.sv:
            raise Inexact(text, "non-canonical text value", changed=False)
        return text

    def from_blob(value, charset=DEFAULT_CHARSET):
        if not isinstance(value, str):
            raise ConversionError("STRING value must be text", value=value)
        codec = charset_codec(charset)
        if codec is None:
            raise ConversionError(f"charset {charset!r} has no text encoding", value=value)
        try:
            raw = codec[1](value)[0]
        except UnicodeEncodeError as exc:
            raise ConversionError(f"text does not encode in {charset}", value=value) from exc
        return pb.Data(dataType=STRING, charset=charset, bv=raw)

    return Codec(ct, "STRING", to_blob, from_blob)


def _bytes_codec(ct: ColumnType, options: Options) -> Codec:
    dt = KIND_DATATYPES[ct.kind]
    charset = "binary" if ct.kind == "binary" else ""

    def to_blob(d: pb.Data):
        out = base64.b64encode(d.bv).decode("ascii")
        if d.dataType != dt or d.charset != charset or d.sv:
            raise Inexact(out, "non-canonical binary value", changed=False)
        return out

    def from_blob(value, _charset=""):
        if not isinstance(value, str):
            raise ConversionError("BYTES value must be base64 text", value=value)
        try:
            raw = base64.b64decode(value, validate=True)
        except ValueError:
            raise ConversionError("BYTES value is not standard base64", value=value) from None
        if base64.b64encode(raw).decode("ascii") != value:
            raise ConversionError("BYTES value is not canonical base64 (non-zero padding bits)", value=value)
        return pb.Data(dataType=dt, charset=charset, bv=raw)

    return Codec(ct, "BYTES", to_blob, from_blob)


def _json_codec(ct: ColumnType, options: Options) -> Codec:
    def to_blob(d: pb.Data):
        try:
            text = d.bv.decode("utf-8")
        except UnicodeDecodeError:
            raise Inexact(None, "json bytes are not UTF-8") from None
        if d.dataType != BYTES or d.charset or d.sv:
            raise Inexact(text, "non-canonical json value", changed=False)
        return text

    def from_blob(value, charset=""):
        if not isinstance(value, str):
            raise ConversionError("json value must be a STRING", value=value)
        return pb.Data(dataType=BYTES, bv=value.encode("utf-8"))

    return Codec(ct, "STRING", to_blob, from_blob)


def _time_codec(ct: ColumnType, options: Options) -> Codec:
    def to_blob(d: pb.Data):
        try:
            text = _text_of(d)
        except UnicodeDecodeError:
            raise Inexact(None, "time text is not UTF-8") from None
        if d.dataType != STRING or d.charset or not d.bv or d.sv:
            raise Inexact(text, "non-canonical time value", changed=False)
        return text

    def from_blob(value, charset=""):
        if not isinstance(value, str):
            raise ConversionError("time value must be a STRING", value=value)
        return pb.Data(dataType=STRING, bv=value.encode("utf-8"))

    return Codec(ct, "STRING", to_blob, from_blob)


# ---- temporal: DATE / DATETIME / TIMESTAMP <-> epoch milliseconds ------------------------------

_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()
_UTC = _dt.timezone.utc
_DATETIME_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?: (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?)?"
                          r"(?: ([+-])(\d{2}):(\d{2}))?\Z")


_ISO_SPEC = {0: "seconds", 3: "milliseconds", 6: "microseconds"}


def _is_utc(zone) -> bool:
    return zone is _UTC or getattr(zone, "key", None) == "UTC"


class InvalidDate(ValueError):
    """MySQL date text of the right shape whose date names no calendar day: the zero date
    `0000-00-00`, a zero month or day (`2020-00-15`), `2021-02-30` (MySQL takes them in its
    default sql_mode of 5.x, or with ALLOW_INVALID_DATES); Options.zero_dates decides."""


TEMPORAL_KINDS = ("date", "datetime", "timestamp")


def temporal_as_text(ct: ColumnType, options: Options) -> ColumnType:
    """The column type a value is converted as: under `zero_dates="string"` date, datetime and
    timestamp columns are read as their text, as TIME columns are (STRING fields; the C path and
    every table already know that kind), so a zero date is written as sent."""
    if options.zero_dates == "string" and ct.kind in TEMPORAL_KINDS:
        return replace(ct, kind="time")
    return ct


def parse_temporal(text: str, zone) -> tuple[int, int]:
    """(epoch milliseconds, microsecond remainder) of MySQL date/datetime/timestamp text.

    Text with its own `+HH:MM` offset is read by that offset, other text in `zone`.
    Raises InvalidDate for zero dates and dates that do not exist, ValueError for other text.
    """
    m = _DATETIME_RE.match(text)
    if not m:
        raise ValueError("not a MySQL date/time text")
    y, mo, d, hh, mi, ss, frac, sign, oh, om = m.groups()
    secs = int(hh or 0) * 3600 + int(mi or 0) * 60 + int(ss or 0)
    if secs >= 86400 or int(mi or 0) > 59 or int(ss or 0) > 59:
        raise ValueError("time of day out of range")
    try:
        day = _dt.date(int(y), int(mo), int(d))
    except ValueError:
        raise InvalidDate(f"no calendar day {y}-{mo}-{d}") from None
    micros = int((frac or "").ljust(6, "0") or 0)
    if sign:
        offset = (int(oh) * 3600 + int(om) * 60) * (-1 if sign == "-" else 1)
    elif _is_utc(zone):
        offset = 0
    else:
        naive = _dt.datetime(day.year, day.month, day.day, secs // 3600, secs // 60 % 60, secs % 60)
        offset = int(naive.replace(tzinfo=zone).utcoffset().total_seconds())
    total = ((day.toordinal() - _EPOCH_ORDINAL) * 86400 + secs - offset) * 1_000_000 + micros
    return total // 1000, total % 1000


def format_temporal(ms: int, kind: str, fsp: int, zone, extra_micros: int = 0) -> str:
    """MySQL text of an epoch-millisecond instant: DATE, DATETIME (in `zone`) or TIMESTAMP (with offset)."""
    if _is_utc(zone) and kind != "timestamp" and fsp in _ISO_SPEC:
        # C-level formatting for the common case; same text as the general path below
        moment = _EPOCH + _dt.timedelta(milliseconds=ms, microseconds=extra_micros)
        return moment.date().isoformat() if kind == "date" else moment.isoformat(" ", _ISO_SPEC[fsp])
    seconds, millis = divmod(ms, 1000)
    if _is_utc(zone):
        local = _dt.datetime(1970, 1, 1) + _dt.timedelta(seconds=seconds)
        offset, year = 0, local.year
    else:
        local, offset, year = _local_time(seconds, zone)
    if not 1 <= year <= 9999:
        raise ValueError(f"year {year} is out of range")
    if kind == "date":
        return f"{year:04d}-{local.month:02d}-{local.day:02d}"
    text = f"{year:04d}-{local.month:02d}-{local.day:02d} {local.hour:02d}:{local.minute:02d}:{local.second:02d}"
    if fsp:
        text += "." + f"{millis * 1000 + extra_micros:06d}"[:fsp]
    if kind == "timestamp":
        sign = "-" if offset < 0 else "+"
        offset = abs(offset)
        text += f" {sign}{offset // 3600:02d}:{offset // 60 % 60:02d}"
    return text


# 400 Gregorian years: the calendar, weekdays included, repeats after them (a zone's yearly rule too)
_CYCLE_SECONDS = 146097 * 86400


def _local_time(seconds: int, zone) -> tuple[_dt.datetime, int, int]:
    """(wall clock, UTC offset in seconds, its year) of an instant in `zone`. An instant whose UTC
    date lies outside Python's years 1..9999 while its wall clock is inside (0001-01-01 00:00 in a
    zone east of UTC, 9999-12-31 23:59 west of it: dates MySQL takes) is read 400 years nearer, where
    the zone keeps the same rule (its oldest offset far back, its yearly rule far ahead), and
    `year` puts the 400 years back."""
    try:
        aware = _dt.datetime.fromtimestamp(seconds, zone)
        shift = 0
    except (OverflowError, ValueError, OSError):
        shift = 400 if seconds < 0 else -400
        aware = _dt.datetime.fromtimestamp(seconds + shift // 400 * _CYCLE_SECONDS, zone)
    return aware.replace(tzinfo=None), int(aware.utcoffset().total_seconds()), aware.year - shift


_EPOCH = _dt.datetime(1970, 1, 1)
_ONE_MICRO = _dt.timedelta(microseconds=1)
_fromisoformat = _dt.datetime.fromisoformat


def _local_fields(text: str | None):
    """(date, time of day to the millisecond) a MySQL text names, ignoring any offset; None if unparsable."""
    m = _DATETIME_RE.match(text or "")
    if not m:
        return None
    y, mo, d, hh, mi, ss, frac = m.groups()[:7]
    return int(y), int(mo), int(d), int(hh or 0), int(mi or 0), int(ss or 0), int((frac or "").ljust(3, "0")[:3])


def _canonical_layout(kind: str, fsp: int) -> tuple[int, re.Pattern, bytes]:
    """(length, byte pattern, suffix) of the canonical UTC text of a temporal kind."""
    pattern = rb"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    if kind != "date":
        pattern += rb" [0-9]{2}:[0-9]{2}:[0-9]{2}"
        if fsp:
            pattern += rb"\.[0-9]{%d}" % fsp
    suffix = b" +00:00" if kind == "timestamp" else b""
    compiled = re.compile(pattern + re.escape(suffix) + rb"\Z")
    length = 10 if kind == "date" else 19 + (1 + fsp if fsp else 0)
    return length + len(suffix), compiled, suffix


def utc_micros(text: str) -> int | None:
    """Microseconds since the epoch of ISO date/time text read as UTC (`datetime.fromisoformat`,
    in C), or None for text it does not take (the general parse then decides)."""
    try:
        return (_fromisoformat(text) - _EPOCH) // _ONE_MICRO
    except ValueError:
        return None


def _temporal_codec(ct: ColumnType, options: Options) -> Codec:
    # Lossless mode keeps every value as sent (raw in the extension): the policies are strict mode's.
    if options.strict and options.zero_dates == "string":
        return _time_codec(temporal_as_text(ct, options), options)
    zero_dates = options.zero_dates if options.strict else "error"
    precision = options.temporal_precision if options.strict else "exact"
    zone = _UTC if options.timezone == "UTC" else options.zone
    kind, fsp = ct.kind, ct.fsp
    length, layout, suffix = _canonical_layout(kind, fsp)
    fast = _is_utc(zone)
    cut = len(suffix)

    def sub_millisecond(ms: int, micros: int, d: pb.Data):
        reason = f"{kind} has sub-millisecond digits"
        if precision == "exact":
            raise Inexact(ms, reason)
        written = ms + 1 if precision == "round" and micros >= 500 else ms
        raise Substituted(written, reason, "fractions", _text_of(d))

    def to_blob(d: pb.Data):
        bv = d.bv
        # Fast path: canonical text in UTC; fromisoformat (C) validates digits and ranges, the fixed
        # layout guarantees that formatting the result gives back the same text.
        if fast and len(bv) == length and layout.match(bv) and d.dataType == STRING \
                and not d.charset and not d.sv:
            us = utc_micros((bv[:-cut] if cut else bv).decode("ascii"))
            if us is not None:
                ms, micros = divmod(us, 1000)
                if micros:
                    sub_millisecond(ms, micros, d)
                return ms
        return slow_to_blob(d)

    def slow_to_blob(d: pb.Data):
        try:
            text = _text_of(d)
        except UnicodeDecodeError:
            raise Inexact(None, f"{kind} text is not UTF-8") from None
        try:
            ms, micros = parse_temporal(text, zone)
        except InvalidDate as exc:
            reason = f"{kind} value is a zero or invalid date ({exc})"
            if zero_dates == "null":
                raise Substituted(None, reason, "zero_dates", text) from None
            raise Inexact(None, reason) from None
        except (ValueError, OverflowError, OSError) as exc:
            raise Inexact(None, f"{kind} value has no epoch time ({exc})") from None
        try:
            again = format_temporal(ms, kind, fsp, zone)
        except (ValueError, OverflowError, OSError):
            again = None
        if again != text and kind != "timestamp" and _local_fields(text) != _local_fields(again):
            # a local time the zone skips (DST gap): no instant reads back as this text
            raise Inexact(ms, f"{kind} {text} does not exist in time zone {options.timezone}")
        if micros:
            sub_millisecond(ms, micros, d)
        if d.dataType != STRING or d.charset or d.sv or again != text:
            raise Inexact(ms, f"{kind} text does not come back from epoch milliseconds", changed=False)
        return ms

    def from_blob(value, charset=""):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConversionError("DATE value must be integer epoch milliseconds", value=value)
        try:
            text = format_temporal(value, kind, fsp, zone)
        except (ValueError, OverflowError, OSError):
            raise ConversionError("DATE value out of range", value=value) from None
        return pb.Data(dataType=STRING, bv=text.encode("ascii"))

    return Codec(ct, "DATE", to_blob, from_blob)


CODECS: dict[str, Callable[[ColumnType, Options], Codec]] = {
    "integer": _integer_codec, "bit": _integer_codec, "year": _integer_codec,
    "boolean": _boolean_codec, "float": _float_codec, "decimal": _decimal_codec,
    "text": _text_codec, "binary": _bytes_codec, "bytes": _bytes_codec, "json": _json_codec,
    "time": _time_codec, "date": _temporal_codec, "datetime": _temporal_codec,
    "timestamp": _temporal_codec,
}


def column_is_boolean(column: pb.Column) -> bool:
    return any(p.key == BOOLEAN_PROPERTY and p.value == "BOOLEAN" for p in column.properties)


def codec_for(column: pb.Column, options: Options = DEFAULT_OPTIONS) -> Codec:
    ct = parse_column_type(column.originalType, column_is_boolean(column))
    return CODECS[ct.kind](ct, options)


class ColumnSetCache:
    """Objects built once per column set and reused across rows and batches (STYLE lesson 6).

    Comparing a table's columns with the copy kept from its previous entry runs in C; only a
    column set that changed pays for building a hashable key.
    """

    def __init__(self, build: Callable[[Any], Any], limit: int = 1024) -> None:
        self._build = build
        self._limit = limit
        self._by_key: dict = {}
        self._last: dict = {}  # slot (e.g. schema and table name) -> (copy of its columns, built)

    def get(self, columns, slot: Any = None):
        last = self._last.get(slot)
        if last is not None and last[0].columns == columns:
            return last[1]
        key = tuple((c.name, c.originalType, c.isKey, tuple((p.key, p.value) for p in c.properties))
                    for c in columns)
        built = self._by_key.get(key)
        if built is None:
            if len(self._by_key) >= self._limit:
                self._by_key.clear()
                self._last.clear()
            built = self._by_key[key] = self._build(columns)
        copy = pb.DMLEvent()
        copy.columns.extend(columns)
        self._last[slot] = (copy, built)
        return built


# ---- raw Data in the lossless extension ---------------------------------------------------------

def data_to_raw(d: pb.Data) -> dict:
    """The exact fields of a Data, JSON-ready (bv as base64)."""
    out: dict = {"dataType": d.dataType}
    if d.charset:
        out["charset"] = d.charset
    if d.sv:
        out["sv"] = d.sv
    if d.bv:
        out["bv"] = base64.b64encode(d.bv).decode("ascii")
    return out


def raw_to_data(raw: dict) -> pb.Data:
    try:
        return pb.Data(dataType=int(raw["dataType"]), charset=raw.get("charset", ""), sv=raw.get("sv", ""),
                       bv=base64.b64decode(raw.get("bv", ""), validate=True))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConversionError(f"bad raw value in the 'dts' extension ({exc})", value=raw) from None
