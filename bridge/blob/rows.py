"""Compiled row-image converters: one Python function per column set, built once (STYLE lesson 6).

The generated function converts a row image whose every value is canonical in one straight run,
without per-value dispatch: each column's check and conversion is inlined for its kind. Anything
it is not sure of (a non-canonical spelling, a charset other than utf8mb4, an unknown DataType,
a value the codec calls inexact) raises `Miss`, and the caller converts the image with the
general per-value path, which decides what is carried raw and what is an error. So the fast
path can only ever agree with the general one.

>>> from bridge import pb
>>> from bridge.values import codec_for
>>> cols = [pb.Column(name="id", originalType="bigint(20)"), pb.Column(name="name", originalType="varchar(8)")]
>>> image = compile_image(["id", "name"], [codec_for(c) for c in cols])
>>> image([pb.Data(dataType=pb.INT64, sv="7"), pb.Data(dataType=pb.STRING, charset="utf8mb4", bv=b"x")])
{'id': 7, 'name': 'x'}
"""
from __future__ import annotations

import base64
import math
from decimal import Decimal

from bridge.errors import ConversionError
from bridge.native import NATIVE, header_properties, speedups, split_items, wire_scan
from bridge.native.contract import BODY_KINDS, NA, NIL, TEMPORAL_KINDS, CharsetMode, Kind, Out
from bridge.values import (
    _DEC_RE,
    BYTES,
    CHARSETS,
    DECIMAL_DT,
    DEFAULT_CHARSET,
    DT,
    MYSQL_LATIN1,
    STRING,
    Codec,
    Inexact,
    charset_codec,
)

DT_INT8 = DT.INT8

__all__ = ["compile_image", "native_plan", "native_tuple_plan", "split_items", "wire_scan", "header_properties", "known_fields", "Miss",
           "MISSES", "NATIVE"]


class Miss(Exception):
    """The fast path is not sure: convert this image with the general path."""


# What sends an image to the general path (which then reports or carries the value).
MISSES = (Miss, Inexact, ConversionError, ValueError, UnicodeDecodeError, TypeError, OverflowError)

# kind -> inline body for a value `d` of the column's canonical DataType; `{n}` is the column.
_BODIES = {
    "long": ("sv = d.sv\n"
             "v = int(sv)\n"
             "if str(v) != sv or not lo{n} <= v <= hi{n} or d.charset or d.bv: raise Miss\n"
             "values[name{n}] = v"),
    "digits": ("sv = d.sv\n"
               "v = int(sv)\n"
               "if str(v) != sv or not lo{n} <= v <= hi{n} or d.charset or d.bv: raise Miss\n"
               "values[name{n}] = sv"),
    "double": ("sv = d.sv\n"
               "v = float(sv)\n"
               "if repr(v) != sv or not isfinite(v) or d.charset or d.bv: raise Miss\n"
               "values[name{n}] = v"),
    "decimal": ("sv = d.sv\n"
                "if not dec_re(sv) or d.charset or d.bv: raise Miss\n"
                "values[name{n}] = sv"),
    "text": ("if d.charset != default_charset or d.sv: raise Miss\n"
             "values[name{n}] = d.bv.decode('utf-8')"),
    "base64": ("if d.charset != charset{n} or d.sv: raise Miss\n"
               "values[name{n}] = b64encode(d.bv).decode('ascii')"),
    "call": "values[name{n}] = to_blob{n}(d)",
}


def _body(codec: Codec) -> tuple[str, int | None, str]:
    """(inline body kind, canonical DataType or None when it depends on the value, the charset a
    canonical value carries) of a column: the one table both fast paths (Python and C) start from."""
    ct = codec.ct
    kind = ct.kind
    if kind in ("integer", "year"):
        return ("digits" if codec.blob_type == "STRING" else "long"), ct.canonical_datatype(), ""
    if kind == "float":
        return "double", ct.canonical_datatype(), ""
    if kind == "decimal" and codec.blob_type == "STRING":
        return "decimal", DECIMAL_DT, ""
    if kind == "text":
        return "text", STRING, DEFAULT_CHARSET
    if kind in ("binary", "bytes"):
        return ("base64", STRING, "binary") if kind == "binary" else ("base64", BYTES, "")
    return "call", None, ""


def compile_image(names: list, codecs: list[Codec]):
    """A function `image(datas) -> dataColumn dict` for canonical images; raises a MISSES error otherwise."""
    scope = {"Miss": Miss, "isfinite": math.isfinite, "dec_re": _DEC_RE.match, "b64encode": base64.b64encode,
             "default_charset": DEFAULT_CHARSET}
    lines = ["def image(datas):",
             f"    if len(datas) != {len(names)}: raise Miss",
             "    values = {}"]
    for n, (name, codec) in enumerate(zip(names, codecs)):
        body, dt, charset = _body(codec)
        scope[f"name{n}"] = name
        scope[f"to_blob{n}"] = codec.to_blob
        if body in ("long", "digits"):
            scope[f"lo{n}"], scope[f"hi{n}"] = codec.ct.int_range
        if body == "base64":
            scope[f"charset{n}"] = charset
        test = f"dt == {dt}" if dt is not None else f"{NIL} < dt < {NA}"
        lines += [f"    d = datas[{n}]",
                  "    dt = d.dataType",
                  f"    if {test}:"]
        lines += ["        " + line for line in _BODIES[body].format(n=n).split("\n")]
        lines += [f"    elif dt == {NIL} and not d.ByteSize():",  # NIL with nothing else set
                  f"        values[name{n}] = None",
                  f"    elif dt != {NA} or d.ByteSize() != 2:",  # anything but a bare NA
                  "        raise Miss"]
    lines.append("    return values")
    exec(compile("\n".join(lines), f"<image of {len(names)} columns>", "exec"), scope)  # noqa: S102
    return scope["image"]


# ---- the C fast path: one Plan per column set over an Entry's wire bytes -----------------------

# kind codes of the C Plan (bridge/native/contract.py): the inline bodies of `_body`, then the kinds only C inlines
_K_BODIES = BODY_KINDS
_K_UTF8, _K_BOOL = Kind.UTF8, Kind.BOOL
_K_TEMPORAL = TEMPORAL_KINDS


def _native_column(name: str, codec: Codec, utc: bool):
    """The Plan column of one codec, or None when the C path does not cover it (then no Plan)."""
    ct = codec.ct
    kind = ct.kind
    body, dt, charset = _body(codec)
    lo = hi = 0
    fsp, need_bv = 0, False
    code = _K_BODIES.get(body)
    if code is not None:
        if body in ("long", "digits"):
            lo, hi = ct.int_range
            if body == "digits" and lo != 0:
                return None
    elif kind == "boolean":
        code, dt = _K_BOOL, DT_INT8
    elif kind == "json":
        code, dt = _K_UTF8, BYTES
    elif kind == "time":
        code, dt, need_bv = _K_UTF8, STRING, True
    elif kind in _K_TEMPORAL and utc and 0 <= ct.fsp <= 6:
        code, dt, fsp = _K_TEMPORAL[kind], STRING, ct.fsp
    elif kind == "bit" and codec.blob_type == "LONG":  # bit(1..63): INT64 digits, as DTS sends them
        code, dt = _K_BODIES["long"], DT.INT64
        lo, hi = ct.int_range
    else:
        return None  # bit(64), decimal as DOUBLE, temporal outside UTC: the Python codecs only
    return (name, code, dt, lo, hi, charset, fsp, need_bv)


def native_plan(names: list, codecs: list[Codec], utc: bool, lossless: bool = True):
    """A `_speedups.Plan` for the column set, or None (no C extension, or a column it does not cover).

    `Plan.rows(entry_bytes, dml_type)` gives the dataColumn dict of each image the DML type's ops
    use, row by row (None for an image the Python path must convert; `(dataColumn, raws, charsets)`
    for one whose values need the lossless extension), or None for the whole Entry; `Plan.lines`
    the JSON lines; `Plan.encode` a Blob image as Data on the wire. `lossless`: the options' mode,
    which decides what a value the Blob value cannot hold exactly costs (docs/decisions.md).
    """
    if not NATIVE:
        return None
    columns = [_native_column(name, codec, utc) for name, codec in zip(names, codecs)]
    if not columns or None in columns:
        return None
    return speedups.Plan(columns, lossless)


# what a Tuple plan makes of a column's value (bridge/native/contract.py's Out): the Blob value, a Decimal of
# its text, the float32 of a FLOAT field, a temporal's epoch microseconds, bytes as hex
_O_SAME, _O_DECIMAL, _O_FLOAT32, _O_MICROS, _O_HEX = Out.SAME, Out.DECIMAL, Out.FLOAT32, Out.MICROS, Out.HEX


def _tuple_column(name: str, ct, field_type: str, utc: bool, hex_binary: bool):
    """The Tuple plan column of one column (ct as tuple_encode.column_type reads it, field_type its
    DataHub type), or None when C does not cover it. The C checks are the Blob plan's, which accept
    a subset of what TO_TUPLE's converters accept; the value is then made as the converter makes it."""
    kind = ct.kind
    lo = hi = 0
    fsp, need_bv, out, charset = 0, False, _O_SAME, ""
    if kind in ("integer", "year", "bit"):
        lo, hi = ct.int_range
        dt = DT.INT64 if kind == "bit" else ct.canonical_datatype()
        if field_type == "DECIMAL":  # bigint unsigned: a Decimal (bit(64) is left to Python)
            if kind == "bit" or lo != 0:
                return None
            code, out = _K_BODIES["digits"], _O_DECIMAL
        else:
            code = _K_BODIES["long"]
    elif kind == "boolean":
        code, dt = _K_BOOL, DT_INT8
    elif kind == "float":
        code, dt = _K_BODIES["double"], ct.canonical_datatype()
        out = _O_FLOAT32 if field_type == "FLOAT" else _O_SAME
    elif kind == "decimal":
        code, dt, out = _K_BODIES["decimal"], DECIMAL_DT, _O_DECIMAL
    elif kind == "text":
        code, dt, charset = _K_BODIES["text"], STRING, DEFAULT_CHARSET
    elif kind in ("binary", "bytes"):
        code, out = _K_BODIES["base64"], (_O_HEX if hex_binary else _O_SAME)
        dt, charset = (STRING, "binary") if kind == "binary" else (BYTES, "")
    elif kind == "json":
        code, dt = _K_UTF8, BYTES
    elif kind == "time":
        code, dt, need_bv = _K_UTF8, STRING, True
    elif kind in _K_TEMPORAL and utc and 0 <= ct.fsp <= 6:
        code, dt, fsp, out = _K_TEMPORAL[kind], STRING, ct.fsp, _O_MICROS
    else:
        return None  # bit(64), temporals outside UTC: TO_TUPLE's converters only
    return (name, code, dt, lo, hi, charset, fsp, need_bv, out)


def native_tuple_plan(names: list, cts: list, field_types: list, utc: bool, hex_binary: bool):
    """A Tuple `_speedups.Plan` for the column set (tuple_encode's column types and field types), or
    None (no C extension, or a column it does not cover: the whole table is Python's).

    `Plan.tuples(entry_bytes, dml_type, seq_key, seq_base, metas)` gives the Tuple rows
    of a DML Entry image by image (None for an image TupleEncoder converts in Python), or None for
    the whole Entry."""
    if not NATIVE:
        return None
    columns = [_tuple_column(n, ct, f, utc, hex_binary) for n, ct, f in zip(names, cts, field_types)]
    if not columns or None in columns:
        return None
    return speedups.Plan(columns, False, Decimal)


# charset table modes of the C (bridge/native/contract.py's CharsetMode)
_CS_UTF8, _CS_CODEC, _CS_CHARMAP = CharsetMode.UTF8, CharsetMode.CODEC, CharsetMode.CHARMAP


def charset_table() -> list[tuple]:
    """values.CHARSETS as `_speedups.set_charsets` takes it: (name, mode, codec, mapping, check) for
    every charset with a text codec, "" (none on the wire) included; `binary` has none, so its text
    values stay with Python."""
    latin1 = MYSQL_LATIN1.decode(bytes(range(256)))[0]  # the decoding table itself
    out = []
    for name, codec in CHARSETS.items():
        if codec is None:
            continue  # binary
        check = charset_codec(name)[2]
        if codec == "utf-8":
            out.append((name, _CS_UTF8, codec, None, check))
        elif codec == "mysql-latin1":
            out.append((name, _CS_CHARMAP, codec, latin1, check))
        else:
            out.append((name, _CS_CODEC, codec, None, check))
    return out


if NATIVE:
    speedups.set_charsets(charset_table())


def known_fields(data: bytes, message: str = "Entry") -> bool:
    """True when C knows that the encoding of a `message` (a subscribe.proto name) holds no unknown
    protobuf field at any depth; False when it may (or there is no C extension)."""
    return NATIVE and speedups.known_fields(data, message)
