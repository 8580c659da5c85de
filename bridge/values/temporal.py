"""MySQL DATE / DATETIME / TIMESTAMP text <-> epoch milliseconds (and microseconds), in a time zone.

The per-value work of the temporal rows of `bridge/values/types.py`: the Blob codec
(`bridge/values/codecs.py`) and the Tuple converters (`bridge/values/tuples.py`) both parse and
format with these functions.

>>> parse_temporal("2021-05-17 15:15:29.879310", _dt.timezone.utc)
(1621264529879, 310)
>>> format_temporal(1621264529879, "datetime", 3, _dt.timezone.utc)
'2021-05-17 15:15:29.879'
"""
from __future__ import annotations

import datetime as _dt
import re
from dataclasses import replace
from typing import TYPE_CHECKING

from bridge.options import Options

if TYPE_CHECKING:
    from bridge.values.columns import ColumnType

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
