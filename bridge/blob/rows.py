"""Compiled row-image converters: one Python function per column set, built once (docs/performance.md, "What made (b) and (d) fast").

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

from bridge.errors import ConversionError
from bridge.native import NATIVE, header_properties, speedups, split_items, wire_scan
from bridge.native.contract import NA, NIL, Kind
from bridge.values import DECIMAL_TEXT, Codec, Inexact
from bridge.values.plans import PlanColumn, plan_column

# split_items, wire_scan, header_properties and NATIVE are bridge.native's, named here for
# bridge/blob/encode.py and the tests that take the Blob path's C helpers from this module.
__all__ = ["compile_image", "native_plan", "split_items", "wire_scan", "header_properties", "known_fields", "Miss",
           "MISSES", "NATIVE"]


class Miss(Exception):
    """The fast path is not sure: convert this image with the general path."""


# What sends an image to the general path (which then reports or carries the value).
MISSES = (Miss, Inexact, ConversionError, ValueError, UnicodeDecodeError, TypeError, OverflowError)

# C kind (bridge/native/contract.py) -> inline body for a value `d` of the column's canonical
# DataType; `{n}` is the column. The kinds C alone inlines (and columns C does not take) are "call".
_BODIES = {
    Kind.LONG: ("sv = d.sv\n"
                "v = int(sv)\n"
                "if str(v) != sv or not lo{n} <= v <= hi{n} or d.charset or d.bv: raise Miss\n"
                "values[name{n}] = v"),
    Kind.DIGITS: ("sv = d.sv\n"
                  "v = int(sv)\n"
                  "if str(v) != sv or not lo{n} <= v <= hi{n} or d.charset or d.bv: raise Miss\n"
                  "values[name{n}] = sv"),
    Kind.DOUBLE: ("sv = d.sv\n"
                  "v = float(sv)\n"
                  "if repr(v) != sv or not isfinite(v) or d.charset or d.bv: raise Miss\n"
                  "values[name{n}] = v"),
    Kind.DECIMAL: ("sv = d.sv\n"
                   "if not dec_re(sv) or d.charset or d.bv: raise Miss\n"
                   "values[name{n}] = sv"),
    Kind.TEXT: ("if d.charset != charset{n} or d.sv: raise Miss\n"
                "values[name{n}] = d.bv.decode('utf-8')"),
    Kind.BASE64: ("if d.charset != charset{n} or d.sv: raise Miss\n"
                  "values[name{n}] = b64encode(d.bv).decode('ascii')"),
    "call": "values[name{n}] = to_blob{n}(d)",
    # a codec whose values may carry a charset the extension names (temporal and time text): a
    # value with another than its own is the per-value path's, which records it
    "call with charset": ("if d.charset != charset{n}: raise Miss\n"
                          "values[name{n}] = to_blob{n}(d)"),
}

# C kind -> the Blob type of the value it makes: a Blob column takes its row's kind only when the
# column's Blob type is that one (decimal="double" leaves DECIMAL columns to the codec)
_KIND_BLOB_TYPES = {Kind.LONG: "LONG", Kind.DIGITS: "STRING", Kind.DOUBLE: "DOUBLE", Kind.DECIMAL: "STRING",
                    Kind.TEXT: "STRING", Kind.BASE64: "BYTES", Kind.UTF8: "STRING", Kind.BOOL: "BOOLEAN",
                    Kind.DATE: "DATE", Kind.DATETIME: "DATE", Kind.TIMESTAMP: "DATE"}


def _blob_column(name: str, codec: Codec, utc: bool) -> PlanColumn | None:
    """`plan_column` of a Blob codec's column, when its kind makes the codec's Blob type."""
    column = plan_column(name, codec.ct, utc)
    if column is None or _KIND_BLOB_TYPES[column.kind] != codec.blob_type:
        return None
    return column


def _body(codec: Codec) -> tuple:
    """(inline body, canonical DataType or None when any value goes to the codec, the charset a
    canonical value carries) of a column of a compiled image."""
    column = _blob_column("", codec, False)  # temporal kinds are C's only
    if column is None or column.kind not in _BODIES:
        if codec.charset is not None:
            return "call with charset", None, codec.charset
        return "call", None, ""
    return column.kind, column.datatype, column.charset


def compile_image(names: list, codecs: list[Codec]):
    """A function `image(datas) -> dataColumn dict` for canonical images; raises a MISSES error otherwise."""
    scope = {"Miss": Miss, "isfinite": math.isfinite, "dec_re": DECIMAL_TEXT.match, "b64encode": base64.b64encode}
    lines = ["def image(datas):",
             f"    if len(datas) != {len(names)}: raise Miss",
             "    values = {}"]
    for n, (name, codec) in enumerate(zip(names, codecs)):
        body, dt, charset = _body(codec)
        scope[f"name{n}"] = name
        scope[f"to_blob{n}"] = codec.to_blob
        if body in (Kind.LONG, Kind.DIGITS):
            scope[f"lo{n}"], scope[f"hi{n}"] = codec.ct.int_range
        if body in (Kind.TEXT, Kind.BASE64, "call with charset"):
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
    columns = [_blob_column(name, codec, utc) for name, codec in zip(names, codecs)]
    if not columns or None in columns:
        return None
    return speedups.Plan([tuple(c)[:-1] for c in columns], lossless)  # a Blob plan's columns have no `out`


def known_fields(data: bytes, message: str = "Entry") -> bool:
    """True when C knows that the encoding of a `message` (a subscribe.proto name) holds no unknown
    protobuf field at any depth; False when it may (or there is no C extension)."""
    return NATIVE and speedups.known_fields(data, message)
