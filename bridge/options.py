"""The one options object shared by the library functions, the Spark transforms and the CLI.

Every option is declared once, with its type, default, choices and a description (the CLI builds
its flags from these declarations); nonsensical combinations are rejected at construction, naming
the option.

>>> Options(decimal="double").decimal
'double'
>>> Options(strict=True, control_events="emit")
Traceback (most recent call last):
...
bridge.errors.OptionsError: option 'control_events' = 'emit' needs the lossless extension; it cannot be combined with strict=True
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bridge.errors import OptionsError

__all__ = ["Options", "DEFAULT_OPTIONS", "option_specs", "per_options"]


def _opt(default, help, choices=None):
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class Options:
    strict: bool = _opt(False, "emit only the documented DataHub fields (no 'dts' extension, no reserved properties)")
    timezone: str = _opt("UTC", "IANA time zone in which DATETIME values (which carry no zone) are read and written")
    decimal: str = _opt("string", "how DECIMAL values travel in Blob messages", ("string", "double"))
    control_events: str | None = _opt(
        None, "checkpoint and rollback entries: emit (lossless default) or drop and count (strict default)", ("emit", "drop"))
    system_time: bool = _opt(False, "add timestamp.systemTime (conversion time; makes output non-deterministic)")
    on_error: str = _opt("fail", "bad records: fail on the first, skip and count them, or keep them with the error",
                         ("fail", "skip", "keep"))
    max_message_bytes: int = _opt(1 << 20, "largest Envelope message written; larger Entries are split into segments")
    # 16 MiB: 4x a whole DataHub PutRecords request (4 MB; one record is at most ~1 MB), so every
    # Blob or Tuple record DataHub can hold passes with room, and a dts-json Entry of 16 MiB; a JSON
    # parse holds at most ~31x its line (measured: `[{},{},...]`), 0.5 GiB here (docs/decisions.md)
    max_line_bytes: int = _opt(16 << 20, "longest line of JSON Lines input (Blob, dts-json, Tuple); a longer one is "
                                         "a rejected record, read past without being held")
    db_version: str = _opt("", "schema.source.dbVersion written when the input does not carry one")
    tuple_binary: str = _opt("base64", "how binary values are written into Tuple STRING fields", ("base64", "hex"))
    source_table: bool = _opt(False, "add the _source_table_ meta column to Tuple rows (topics that take several tables)")
    zero_dates: str = _opt(
        "null", "zero and invalid dates (0000-00-00, 2021-02-30) in Tuple rows and strict Blob, and dates beyond "
                "DataHub's TIMESTAMP range in Tuple rows: null (counted), error, or string (date, datetime and "
                "timestamp columns become STRING fields of the text as sent)",
        ("null", "error", "string"))
    temporal_precision: str = _opt(
        "truncate", "fractional seconds a strict Blob DATE (milliseconds) cannot hold: truncate or round "
                    "(counted), or exact (an error naming the value)", ("exact", "truncate", "round"))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            choices = f.metadata.get("choices")
            if choices is not None and value is not None and value not in choices:
                raise OptionsError(f"option {f.name!r} must be one of {', '.join(choices)}", value=value)
            if f.type in ("bool", bool) and not isinstance(value, bool):
                raise OptionsError(f"option {f.name!r} must be true or false", value=value)
            if f.type in ("str", str) and not isinstance(value, str):
                raise OptionsError(f"option {f.name!r} must be a string", value=value)
        if not isinstance(self.max_message_bytes, int) or not 64 <= self.max_message_bytes <= 1 << 30:
            raise OptionsError("option 'max_message_bytes' must be an integer between 64 and 1 GiB",
                               value=self.max_message_bytes)
        if type(self.max_line_bytes) is not int or not 1 <= self.max_line_bytes <= 1 << 40:
            raise OptionsError("option 'max_line_bytes' must be an integer between 1 and 1 TiB",
                               value=self.max_line_bytes)
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise OptionsError("option 'timezone' is not a known IANA time zone", value=self.timezone) from None
        if self.strict and self.control_events == "emit":
            raise OptionsError("option 'control_events' = 'emit' needs the lossless extension; "
                               "it cannot be combined with strict=True")

    @property
    def lossless(self) -> bool:
        return not self.strict

    @property
    def emit_control(self) -> bool:
        """Whether checkpoint and rollback entries travel (they do in lossless mode unless dropped)."""
        return self.control_events == "emit" or (self.control_events is None and not self.strict)

    @cached_property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def replace(self, **changes) -> Options:
        return dataclasses.replace(self, **changes)


def per_options(factory):
    """`get(options)` -> one shared `factory(options)` per Options value (a few are kept). The
    last call's Options object is checked first, by identity: hashing Options costs per Entry."""
    instances: dict = {}
    last: tuple = (None, None)  # (options, instance), swapped whole: no thread pairs one's options with another's

    def get(options: Options):
        nonlocal last
        seen = last
        if options is seen[0]:
            return seen[1]
        instance = instances.get(options)
        if instance is None:
            if len(instances) >= 32:
                instances.clear()
            instance = instances[options] = factory(options)
        last = (options, instance)
        return instance

    return get


def option_specs() -> list[tuple[str, str, object, tuple | None, str]]:
    """(name, type, default, choices, description) for every option, in declaration order."""
    return [(f.name, str(f.type), f.default, f.metadata["choices"], f.metadata["help"])
            for f in dataclasses.fields(Options)]


DEFAULT_OPTIONS = Options()
