"""Tuple value converters: one pair of factories per MySQL type family (the `to_tuple` and
`from_tuple` columns of the table in `bridge/values/types.py`).

`to_tuple` factories: (ColumnType, Options) -> to_tuple(Data) -> the Tuple value (int, float,
Decimal, bool, str, epoch microseconds); NIL and NA never reach them. A Tuple row has no lossless
extension, so a value a field cannot hold exactly is a ConversionError (docs/tuple.md).
`from_tuple` factories: (ColumnType, Options) -> from_tuple(checked Tuple value) -> canonical Data.
"""
from __future__ import annotations

import base64
import binascii
import datetime
import math
import re
import struct
from collections.abc import Callable
from decimal import Context, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, NamedTuple

from bridge.errors import ConversionError
from bridge.options import Options
from bridge.values.charsets import charset_codec
from bridge.values.codecs import DECIMAL_TEXT, FLOAT_TEXT, INT_TEXT, Substituted, _text_codec
from bridge.values.temporal import InvalidDate, format_temporal, parse_temporal, utc_micros
from bridge.wire import subscribe_pb2 as pb

if TYPE_CHECKING:
    from bridge.values.columns import ColumnType

DT = pb.DataType
# Epoch microseconds pydatahub accepts for a TIMESTAMP field.
TIMESTAMP_RANGE = (-62135798400000000, 253402271999000000)

# ---- DTS values -> Tuple values, per family -------------------------------------------------------

def float32(v: float, error=ConversionError) -> float:
    """The float32 a FLOAT field stores for `v` (as DataHub does), or `error` when it overflows."""
    try:
        return struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        raise error("value outside the range of FLOAT", value=v) from None


ToTuple = Callable[[pb.Data], Any]


def _integer_to_tuple(ct: ColumnType, options: Options) -> ToTuple:
    lo, hi = ct.int_range
    as_decimal = ct.wide  # a DECIMAL field (bigint unsigned, bit(64))

    def to_tuple(d: pb.Data):
        if not INT_TEXT.match(d.sv):
            raise ConversionError("not an integer", value=d.sv or d.bv)
        v = int(d.sv)
        if not lo <= v <= hi:
            raise ConversionError(f"integer outside the range of {ct.text}", value=d.sv)
        return Decimal(v) if as_decimal else v
    return to_tuple


def _boolean_to_tuple(ct: ColumnType, options: Options) -> ToTuple:
    def to_tuple(d: pb.Data):
        if d.sv not in ("0", "1"):
            raise ConversionError("BOOLEAN column value is not 0 or 1", value=d.sv or d.bv)
        return d.sv == "1"
    return to_tuple


def _float_to_tuple(ct: ColumnType, options: Options) -> ToTuple:
    single = ct.canonical_datatype() == DT.FLOAT32  # a FLOAT field

    def to_tuple(d: pb.Data):
        if not FLOAT_TEXT.match(d.sv):
            raise ConversionError("not a finite number", value=d.sv or d.bv)
        v = float(d.sv)
        if math.isinf(v):
            raise ConversionError("value outside the range of DOUBLE", value=d.sv)
        return float32(v) if single else v
    return to_tuple


def _decimal_to_tuple(ct: ColumnType, options: Options) -> ToTuple:
    def to_tuple(d: pb.Data):
        if not DECIMAL_TEXT.match(d.sv):
            raise ConversionError("not a decimal number", value=d.sv or d.bv)
        return Decimal(d.sv)
    return to_tuple


def _text_to_tuple(ct: ColumnType, options: Options) -> ToTuple:
    def to_tuple(d: pb.Data):
        codec = charset_codec(d.charset)
        if codec is None:
            raise ConversionError(f"charset {d.charset!r} has no text decoding", value=d.bv)
        try:
            return codec[0](d.bv)[0]
        except UnicodeDecodeError as exc:
            raise ConversionError(f"bytes do not decode as {d.charset or 'utf8'} ({exc.reason} at byte "
                                  f"{exc.start})", value=d.bv) from None
    return to_tuple


# Options.tuple_binary -> (encode bytes to text, decode text to bytes)
BINARY_TEXT: dict[str, tuple[Callable[[bytes], str], Callable[[str], bytes]]] = {
    "base64": (lambda b: base64.b64encode(b).decode("ascii"), lambda s: base64.b64decode(s, validate=True)),
    "hex": (lambda b: b.hex(), bytes.fromhex),
}


def _bytes_to_tuple(ct: ColumnType, options: Options) -> ToTuple:
    encode = BINARY_TEXT[options.tuple_binary][0]
    return lambda d: encode(d.bv)


def _utf8_to_tuple(ct: ColumnType, options: Options) -> ToTuple:
    """json (BYTES) and time (STRING) columns: UTF-8 text in `bv`."""
    def to_tuple(d: pb.Data):
        try:
            return d.bv.decode("utf-8") if d.bv or not d.sv else d.sv
        except UnicodeDecodeError:
            raise ConversionError(f"{ct.kind} bytes are not UTF-8", value=d.bv) from None
    return to_tuple


# UTC text datetime.fromisoformat (C) reads as parse_temporal does; anything else takes parse_temporal
_UTC_TEXT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?: [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?)?(?: \+00:00)?\Z")


def _temporal_to_tuple(ct: ColumnType, options: Options) -> ToTuple:
    """TIMESTAMP (epoch microseconds: every fractional digit MySQL has fits, so
    Options.temporal_precision never acts here); a zero or invalid date, and a date MySQL takes
    beyond DataHub's TIMESTAMP range (`9999-12-31 23:59:59` read in UTC), follow Options.zero_dates
    ("string" reads the column as text instead: `temporal_as_text`)."""
    zone, kind = options.zone, ct.kind
    lo, hi = TIMESTAMP_RANGE
    wall = 10 if kind == "date" else 19
    utc = options.timezone == "UTC"
    check_wall = kind != "timestamp" and not utc
    null_zero_dates = options.zero_dates == "null"
    zero_reasons: dict = {}  # text -> reason of a zero or invalid date seen before (a few spellings recur)

    def to_tuple(d: pb.Data):
        text = _ascii_text(d, kind)
        if text in zero_reasons:
            if null_zero_dates:
                raise Substituted(None, zero_reasons[text], "zero_dates", text)
            raise ConversionError(zero_reasons[text], value=text)
        if utc and _UTC_TEXT.match(text):
            us = utc_micros(text[:-7] if text.endswith(" +00:00") else text)
            if us is not None and lo <= us <= hi:  # else parse_temporal names the error
                return us
        try:
            ms, micros = parse_temporal(text, zone)
        except InvalidDate as exc:
            reason = f"{kind} value is a zero or invalid date ({exc}; option zero_dates={options.zero_dates})"
            if len(zero_reasons) < 64:
                zero_reasons[text] = reason
            if null_zero_dates:
                raise Substituted(None, reason, "zero_dates", text) from None
            raise ConversionError(reason, value=text) from None
        except (ValueError, OverflowError) as exc:
            raise ConversionError(f"{kind} value has no epoch time ({exc})", value=text) from None
        us = ms * 1000 + micros
        if not lo <= us <= hi:
            reason = f"{kind} value outside the TIMESTAMP range (option zero_dates={options.zero_dates})"
            if null_zero_dates:
                raise Substituted(None, reason, "out_of_range", text)
            raise ConversionError(reason, value=text)
        if check_wall and format_temporal(ms, kind, 0, zone)[:wall] != text[:wall]:
            raise ConversionError(f"{kind} value does not exist in {options.timezone}", value=text)
        return us
    return to_tuple


def _ascii_text(d: pb.Data, kind: str) -> str:
    try:
        return d.bv.decode("ascii") if d.bv else d.sv
    except UnicodeDecodeError:
        raise ConversionError(f"{kind} text is not ASCII", value=d.bv) from None

# ---- checked Tuple values -> DTS Data, per family ---------------------------------------------------

FromTuple = Callable[[Any], pb.Data]
_DEC_CONTEXT = Context(prec=200)


def _integer_from_tuple(ct: ColumnType, options: Options) -> FromTuple:
    lo, hi = ct.int_range
    as_decimal = ct.wide  # a DECIMAL field (bigint unsigned, bit(64))

    def from_tuple(v):
        if as_decimal:
            if v != v.to_integral_value():
                raise ConversionError(f"{ct.text} value must be a whole number", value=v)
            v = int(v)
        if not lo <= v <= hi:
            raise ConversionError(f"value outside the range of {ct.text}", value=v)
        return pb.Data(dataType=ct.canonical_datatype(v), sv=str(v))
    return from_tuple


def _float_from_tuple(ct: ColumnType, options: Options) -> FromTuple:
    dt = ct.canonical_datatype()
    return lambda v: pb.Data(dataType=dt, sv=repr(v))


def decimal_text(value: Decimal, precision: int, scale: int) -> str:
    """Canonical DTS text of a DECIMAL(precision, scale) value: exactly `scale` fraction digits."""
    try:
        q = value.quantize(Decimal((0, (1,), -scale)), context=_DEC_CONTEXT)
    except InvalidOperation:
        q = None
    if q is None or q != value:
        raise ConversionError(f"value does not fit decimal({precision},{scale})", value=value)
    text = f"{q:f}"
    if q == 0:
        text = text.lstrip("-")
    if len(text.partition(".")[0].lstrip("-").lstrip("0")) > precision - scale:
        raise ConversionError(f"value does not fit decimal({precision},{scale})", value=value)
    return text


def _decimal_from_tuple(ct: ColumnType, options: Options) -> FromTuple:
    precision, scale = ct.length, ct.scale or 0
    return lambda v: pb.Data(dataType=pb.DECIMAL, sv=decimal_text(v, precision, scale))


def _text_from_tuple(ct: ColumnType, options: Options) -> FromTuple:
    blob = _text_codec(ct, options)
    return lambda v: blob.from_blob(v, "utf8mb4")


def _blob_from_tuple(ct: ColumnType, options: Options) -> FromTuple:
    """boolean, json and time: the Blob codec's way back takes the same Python value."""
    return ct.row.codec(ct, options).from_blob


def _bytes_from_tuple(ct: ColumnType, options: Options) -> FromTuple:
    decode = BINARY_TEXT[options.tuple_binary][1]
    dt = ct.canonical_datatype()
    charset = ct.row.charset

    def from_tuple(v):
        try:
            return pb.Data(dataType=dt, charset=charset, bv=decode(v))
        except (ValueError, binascii.Error):
            raise ConversionError(f"STRING value is not {options.tuple_binary} text", value=v) from None
    return from_tuple


def _temporal_from_tuple(ct: ColumnType, options: Options) -> FromTuple:
    zone, kind, fsp = options.zone, ct.kind, ct.fsp

    def from_tuple(us):
        ms, extra = divmod(us, 1000)
        try:
            text = format_temporal(ms, kind, fsp, zone, extra)
            back_ms, back_micros = parse_temporal(text, zone)
        except (ValueError, OverflowError, OSError):
            raise ConversionError(f"TIMESTAMP value out of range for {ct.text}", value=us) from None
        if back_ms * 1000 + back_micros != us:
            raise ConversionError(f"TIMESTAMP value has no exact {ct.text} text in {options.timezone}", value=us)
        return pb.Data(dataType=pb.STRING, bv=text.encode("ascii"))
    return from_tuple


# ---- the C fast path of Tuple -> DTS: checked Tuple values -> the Blob value C writes ---------------
#
# A Blob plan's `encode` writes each column's Data from its Blob value as the Blob codec's from_blob
# does. For most columns the checked Tuple value is that Blob value and the row's from_tuple makes
# the same Data (integers, floats, booleans, text, json, time, base64 binary). The rest are adapted
# first, and only where the Data is sure to be from_tuple's; anything else leaves the image to the
# Python converters, which decide (and name the error). One adapter factory per C kind, named by
# the row's `c_kind` (`NativeKind.from_tuple`, bridge/values/types.py); bridge/tuple/decode.py
# calls it: (ColumnType, field type, the field's integer range or None, Options) -> None (the value
# as it is), a function (value -> Blob value, or C_MISS), AsText(function), or False (C does not
# take the column).

C_MISS = object()  # an adapter's "not sure": the image goes to the converters
_DIGITS = re.compile(r"(?:0|[1-9][0-9]*)\Z").match
_DAY_MICROS = 86_400_000_000
_EPOCH = datetime.datetime(1970, 1, 1)
_timedelta = datetime.timedelta


class AsText(NamedTuple):
    """An adapter whose column C writes as text without charset in `bv` (the UTF8 kind with the
    STRING DataType: the Data from_tuple makes) in place of its temporal kind; the text is made
    by `adapt`. A temporal column with sub-millisecond digits (fsp 4..6) in UTC: C's temporal
    kinds write milliseconds."""
    adapt: Callable[[Any], Any]


def _decimal_pattern(precision: int, scale: int):
    """Text `str(value)` of a Decimal has when it is `decimal_text(value, precision, scale)`: exactly
    `scale` fraction digits, no exponent, no leading zero, at most precision - scale integer digits,
    no negative zero."""
    whole = precision - scale
    if whole < 0:
        return None
    integer = "0" if whole == 0 else f"(?:0|[1-9][0-9]{{0,{whole - 1}}})"
    fraction = f"\\.[0-9]{{{scale}}}" if scale else ""
    return re.compile(rf"(?!-0(?:\.0*)?\Z)-?{integer}{fraction}\Z").match


def _long_c_from_tuple(ct: ColumnType, field_type: str, field_range, options: Options):
    """int; the field's check held it to the field's range, the column's may be narrower."""
    if field_range is None:
        return False
    (flo, fhi), (lo, hi) = field_range, ct.int_range
    if lo <= flo and fhi <= hi:
        return None
    return lambda v: v if lo <= v <= hi else C_MISS


def _digits_c_from_tuple(ct: ColumnType, field_type: str, field_range, options: Options):
    """bigint unsigned: a whole Decimal -> its digits."""
    if field_type != "DECIMAL":
        return False
    hi = ct.int_range[1]

    def digits(v):
        if type(v) is not Decimal:
            return C_MISS
        text = str(v)
        return text if _DIGITS(text) and (len(text) < 20 or int(text) <= hi) else C_MISS
    return digits


def _decimal_c_from_tuple(ct: ColumnType, field_type: str, field_range, options: Options):
    """A Decimal already at the column's scale -> its text."""
    match = _decimal_pattern(ct.length, ct.scale or 0) if field_type == "DECIMAL" else None
    if match is None:
        return False

    def text(v):
        if type(v) is not Decimal:
            return C_MISS
        t = str(v)
        return t if match(t) else C_MISS
    return text


def _date_c_from_tuple(ct: ColumnType, field_type: str, field_range, options: Options):
    """Epoch microseconds -> milliseconds, when they are a whole day (the converter's round trip
    then gives the value back; a value it would refuse stays Python's)."""
    if field_type != "TIMESTAMP":
        return False
    return lambda v: v // 1000 if type(v) is int and not v % _DAY_MICROS else C_MISS


def _datetime_c_from_tuple(ct: ColumnType, field_type: str, field_range, options: Options):
    """Epoch microseconds -> milliseconds, when the column's text holds every digit of them;
    DATETIME(4..6), TIMESTAMP(4..6): the text, made here (AsText)."""
    if field_type != "TIMESTAMP":
        return False
    if ct.fsp > 3:
        return AsText(_micro_text(ct))
    unit = max(1000, 10 ** (6 - ct.fsp))
    return lambda v: v // 1000 if type(v) is int and not v % unit else C_MISS


def _micro_text(ct: ColumnType):
    fsp = ct.fsp
    unit, width = 10 ** (6 - fsp), 20 + fsp
    suffix = " +00:00" if ct.kind == "timestamp" else ""

    def micro_text(v):
        if type(v) is not int or v % unit:
            return C_MISS
        try:
            moment = _EPOCH + _timedelta(microseconds=v)
        except OverflowError:  # beyond years 1..9999: the converter names it
            return C_MISS
        return moment.isoformat(" ", "microseconds")[:width] + suffix
    return micro_text


def _base64_c_from_tuple(ct: ColumnType, field_type: str, field_range, options: Options):
    """Binary as base64 text is the Blob value; hex text is the converters'."""
    return False if options.tuple_binary != "base64" else None
