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
from bridge.native.contract import NA, NIL
from bridge.values import DECIMAL_TEXT, Codec, Inexact
from bridge.values.plans import PlanColumn, plan_column
from bridge.values.types import native_of

# split_items, wire_scan, header_properties and NATIVE are bridge.native's, named here for
# bridge/blob/encode.py and the tests that take the Blob path's C helpers from this module.
__all__ = ["compile_image", "native_plan", "split_items", "wire_scan", "header_properties", "known_fields", "Miss",
           "MISSES", "NATIVE"]


class Miss(Exception):
    """The fast path is not sure: convert this image with the general path."""


# What sends an image to the general path (which then reports or carries the value).
MISSES = (Miss, Inexact, ConversionError, ValueError, UnicodeDecodeError, TypeError, OverflowError)

# A column's inline body in a compiled image is its row's C kind's (`NativeKind.image`, named by the
# row's `c_kind` in bridge/values/types.py); a column whose kind has none (and a column C does not
# take) calls its codec: "call", or "call with charset" for a codec whose values may carry a charset
# the extension names (temporal and time text: a value with another than its own is the per-value
# path's, which records it).
_CALLS = {
    "call": "values[name{n}] = to_blob{n}(d)",
    "call with charset": ("if d.charset != charset{n}: raise Miss\n"
                          "values[name{n}] = to_blob{n}(d)"),
}


def _blob_column(name: str, codec: Codec, utc: bool) -> PlanColumn | None:
    """`plan_column` of a Blob codec's column, when its kind makes the codec's Blob type (the row's
    `NativeKind.blob_type`: `decimal="double"` leaves DECIMAL columns to the codec)."""
    column = plan_column(name, codec.ct, utc)
    if column is None or native_of(codec.ct).blob_type != codec.blob_type:
        return None
    return column


def _body(codec: Codec) -> tuple:
    """(inline body, canonical DataType or None when any value goes to the codec, the charset a
    canonical value carries) of a column of a compiled image."""
    column = _blob_column("", codec, False)  # temporal kinds are C's only
    image = None if column is None else native_of(codec.ct).image
    if image is None:
        if codec.charset is not None:
            return _CALLS["call with charset"], None, codec.charset
        return _CALLS["call"], None, ""
    return image, column.datatype, column.charset


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
        if "lo{n}" in body:
            scope[f"lo{n}"], scope[f"hi{n}"] = codec.ct.int_range
        if "charset{n}" in body:
            scope[f"charset{n}"] = charset
        test = f"dt == {dt}" if dt is not None else f"{NIL} < dt < {NA}"
        lines += [f"    d = datas[{n}]",
                  "    dt = d.dataType",
                  f"    if {test}:"]
        lines += ["        " + line for line in body.format(n=n).split("\n")]
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
