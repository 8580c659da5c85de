"""Blob value codecs: one factory per MySQL type family (the `codec` column of the table in
`bridge/values/types.py`), each giving a `Codec` that converts one column's `Data` to its Blob
value and back.

`to_blob(data)` returns the value when the Blob value gives back exactly the same `Data`; otherwise
it raises `Inexact(best, reason)`, `best` being the closest Blob value or None; the row codec then
carries the raw Data in the lossless extension or reports the reason (strict mode).
`from_blob(value)` rebuilds the canonical `Data`.
"""
from __future__ import annotations

import base64
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.errors import ConversionError
from bridge.options import Options
from bridge.values.charsets import DEFAULT_CHARSET, charset_codec
from bridge.values.temporal import (
    _UTC,
    InvalidDate,
    _canonical_layout,
    _is_utc,
    _local_fields,
    format_temporal,
    parse_temporal,
    temporal_as_text,
    utc_micros,
)
from bridge.wire import subscribe_pb2 as pb

if TYPE_CHECKING:
    from bridge.values.columns import ColumnType

DT = pb.DataType
# Plain ints: attribute access on protobuf's enum wrappers is slow in hot loops.
NIL, NA, STRING, BYTES, DECIMAL_DT = int(DT.NIL), int(DT.NA), int(DT.STRING), int(DT.BYTES), int(DT.DECIMAL)


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


# the canonical number texts, ASCII digits only (Blob codecs, Tuple converters, the compiled images)
INT_TEXT = re.compile(r"-?[0-9]+\Z")
DECIMAL_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?\Z")
FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
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
    # The charset a value of the column has when the lossless extension's dts.charsets names none
    # (its entry carries any other); None: the Blob value keeps no charset (a value with one is
    # inexact). Text: utf8mb4. Temporal and time text: none, and any charset DTS puts on it (a
    # label: the ASCII text reads the same in all of them) travels in dts.charsets.
    charset: str | None = None


# The compiled images' inline twins of C's value kinds (bridge/blob/rows.py; `NativeKind.image`,
# named by the rows in bridge/values/types.py): the body that converts a value `d` of the column's
# canonical DataType as the codec's to_blob does, raising Miss where it is not sure; `{n}` is the
# column, `lo{n}`/`hi{n}` its integer range and `charset{n}` its canonical charset.
LONG_IMAGE = ("sv = d.sv\n"
              "v = int(sv)\n"
              "if str(v) != sv or not lo{n} <= v <= hi{n} or d.charset or d.bv: raise Miss\n"
              "values[name{n}] = v")
DIGITS_IMAGE = ("sv = d.sv\n"
                "v = int(sv)\n"
                "if str(v) != sv or not lo{n} <= v <= hi{n} or d.charset or d.bv: raise Miss\n"
                "values[name{n}] = sv")
DOUBLE_IMAGE = ("sv = d.sv\n"
                "v = float(sv)\n"
                "if repr(v) != sv or not isfinite(v) or d.charset or d.bv: raise Miss\n"
                "values[name{n}] = v")
DECIMAL_IMAGE = ("sv = d.sv\n"
                 "if not dec_re(sv) or d.charset or d.bv: raise Miss\n"
                 "values[name{n}] = sv")
TEXT_IMAGE = ("if d.charset != charset{n} or d.sv: raise Miss\n"
              "values[name{n}] = d.bv.decode('utf-8')")
BASE64_IMAGE = ("if d.charset != charset{n} or d.sv: raise Miss\n"
                "values[name{n}] = b64encode(d.bv).decode('ascii')")


def _label(charset) -> str:
    """A dts.charsets entry as the charset label of a temporal or time Data (a str protobuf takes)."""
    if not isinstance(charset, str):
        raise ConversionError("a dts.charsets entry must be a string", value=charset)
    try:
        charset.encode("utf-8")
    except UnicodeEncodeError:
        raise ConversionError("a dts.charsets entry is not UTF-8 text", value=charset) from None
    return charset


def _integer_codec(ct: ColumnType, options: Options) -> Codec:
    lo, hi = ct.int_range
    as_text = ct.wide  # bigint unsigned, bit(64): exact digits in a STRING
    fixed_dt = None if ct.kind == "bit" else ct.canonical_datatype()

    def to_blob(d: pb.Data):
        sv = d.sv
        try:
            v = int(sv)
        except ValueError:
            raise ConversionError("not an integer", value=sv) from None
        if str(v) != sv:
            if not INT_TEXT.match(sv):
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
            if not isinstance(value, str) or not INT_TEXT.match(value):
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
        if not FLOAT_TEXT.match(sv):
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
        if not DECIMAL_TEXT.match(sv):
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
        if not isinstance(value, str) or not DECIMAL_TEXT.match(value):
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

    return Codec(ct, "STRING", to_blob, from_blob, DEFAULT_CHARSET)


def _bytes_codec(ct: ColumnType, options: Options) -> Codec:
    dt = ct.canonical_datatype()
    charset = ct.row.charset

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


def _utf8_codec(ct: ColumnType, options: Options) -> Codec:
    """json and time columns: their UTF-8 text as a STRING. A json value is its bytes (BYTES); a
    time value its text (STRING), which a canonical value has in `bv`, never empty (the row's
    `need_bv`)."""
    kind, dt, need_bv = ct.kind, ct.canonical_datatype(), ct.row.need_bv
    not_utf8 = f"{kind} text is not UTF-8" if need_bv else f"{kind} bytes are not UTF-8"
    labelled = dt == STRING  # time text: a charset on it is a label (dts.charsets); json's BYTES have none

    def to_blob(d: pb.Data):
        try:
            text = _text_of(d) if need_bv else d.bv.decode("utf-8")
        except UnicodeDecodeError:
            raise Inexact(None, not_utf8) from None
        if d.dataType != dt or d.charset and not labelled or d.sv or need_bv and not d.bv:
            raise Inexact(text, f"non-canonical {kind} value", changed=False)
        return text

    def from_blob(value, charset=""):
        if not isinstance(value, str):
            raise ConversionError(f"{kind} value must be a STRING", value=value)
        return pb.Data(dataType=dt, charset=_label(charset) if labelled and charset != "" else "",
                       bv=value.encode("utf-8"))

    return Codec(ct, "STRING", to_blob, from_blob, "" if labelled else None)


def _temporal_codec(ct: ColumnType, options: Options) -> Codec:
    # Lossless mode keeps every value as sent (raw in the extension): the policies are strict mode's.
    if options.strict and options.zero_dates == "string":
        return _utf8_codec(temporal_as_text(ct, options), options)
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
        if d.dataType != STRING or d.sv or again != text:
            raise Inexact(ms, f"{kind} text does not come back from epoch milliseconds", changed=False)
        return ms  # a charset on it travels in dts.charsets (Codec.charset)

    def from_blob(value, charset=""):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConversionError("DATE value must be integer epoch milliseconds", value=value)
        try:
            text = format_temporal(value, kind, fsp, zone)
        except (ValueError, OverflowError, OSError):
            raise ConversionError("DATE value out of range", value=value) from None
        return pb.Data(dataType=STRING, charset=_label(charset) if charset != "" else "", bv=text.encode("ascii"))

    return Codec(ct, "DATE", to_blob, from_blob, "")


class ColumnSetCache:
    """Objects built once per column set and reused across rows and batches (docs/performance.md, "What made (b) and (d) fast").

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
