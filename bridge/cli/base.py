"""What the command-line modules share, so that each command group imports it from here and none
imports another (no circles): the usage error, the file formats and how a name and a flag pick
one, the conversion flags declared once in `bridge.options.option_specs()`, the rejects and
ledger sinks, the help layout, and output files renamed into place on success (numbered input
lines come from `bridge.wire.framing.read_lines`)."""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import orjson

from bridge.errors import OptionsError
from bridge.options import Options, option_specs
from bridge.pipeline.options import PipelineOptions, cli_flag, pipeline_option_specs
from bridge.stream import Tally

PROG = "dts-bridge"
DEBUG_ENV = "DTS_BRIDGE_DEBUG"  # set: unexpected exceptions keep their traceback (the tests set it)


class UsageError(Exception):
    """A wrong command line: exit 2 with the message."""


class _Outputs:
    """Output files written under temporary names and renamed into place only when the run
    ends without an error, so a failed run never leaves a half-written file that looks whole."""

    def __init__(self) -> None:
        self._open: list[tuple[Any, pathlib.Path | None, pathlib.Path]] = []

    def open(self, path: str):
        if path == "-":
            return sys.stdout.buffer
        target = pathlib.Path(path)
        if target.exists() and not target.is_file():
            # a device or pipe (/dev/null, a FIFO): written as it is, never renamed over
            try:
                fh = open(target, "wb")
            except OSError as err:
                raise UsageError(f"cannot write {path}: {err.strerror}") from None
            self._open.append((fh, None, target))
            return fh
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
            fh = open(tmp, "wb")
        except OSError as err:
            raise UsageError(f"cannot write {path}: {err.strerror}") from None
        self._open.append((fh, tmp, target))
        return fh

    def reserve(self, path: str) -> str:
        """A temporary path for a writer that takes a path; renamed into place on commit."""
        fh = self.open(path)
        fh.close()
        tmp = self._open[-1][1]
        return str(tmp if tmp is not None else path)

    def commit(self) -> None:
        for fh, tmp, target in self._open:
            fh.close()
            if tmp is not None:
                os.replace(tmp, target)
        self._open.clear()

    def abort(self) -> None:
        for fh, tmp, _ in self._open:
            fh.close()
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        self._open.clear()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# ---- formats ------------------------------------------------------------------------------------

# File name ending -> (side, framing); the longest matching ending wins.
EXTENSIONS: dict[str, tuple[str, str]] = {
    ".pb": ("dts", "pb"),
    ".dts.jsonl": ("dts", "json"),
    ".jsonl": ("blob", "jsonl"),
    ".csv": ("tuple", "csv"),
    ".parquet": ("tuple", "parquet"),
}
# --from / --to name -> (side, framing; None = from the file name, else the side's default).
FORMATS: dict[str, tuple[str, str | None]] = {
    "dts": ("dts", None),
    "dts-json": ("dts", "json"),
    "blob": ("blob", "jsonl"),
    "tuple": ("tuple", None),
}
DEFAULT_FRAMING = {"dts": "pb", "blob": "jsonl", "tuple": "jsonl"}
FRAMING_NAMES = {"pb": ".pb (Envelope stream)", "json": "dts-json", "jsonl": "JSON Lines", "csv": "CSV",
                 "parquet": "Parquet"}


def _extension(path: str) -> str | None:
    name = path.lower()
    for ext in sorted(EXTENSIONS, key=len, reverse=True):
        if name.endswith(ext):
            return ext
    return None


def resolve_format(path: str, name: str | None, flag: str) -> tuple[str, str]:
    """(side, framing) of a file from its name and the --from/--to flag, which must agree."""
    ext = _extension(path) if path != "-" else None
    if name is None:
        if ext is None:
            what = "standard input/output" if path == "-" else f"the name {path!r}"
            raise UsageError(f"cannot tell the format from {what}: pass {flag} {'|'.join(FORMATS)}")
        return EXTENSIONS[ext]
    side, framing = FORMATS[name]
    if ext is not None:
        ext_side, ext_framing = EXTENSIONS[ext]
        if ext_side == "blob" and side == "tuple":
            ext_side = "tuple"  # .jsonl holds Tuple rows when the flag says so
        if ext_side != side or (framing is not None and framing != ext_framing):
            raise UsageError(f"{flag} {name} does not fit the file name {path!r} "
                             f"({ext} is {ext_side} {FRAMING_NAMES[ext_framing]})")
        framing = ext_framing
    return side, framing or DEFAULT_FRAMING[side]


# ---- options, declared once in bridge.options --------------------------------------------------

# The sides of a conversion an option means something for; given for any other conversion it is
# a usage error naming the option, never silently ignored. Options not listed apply everywhere.
OPTION_SIDES: dict[str, frozenset] = {
    "strict": frozenset({"blob", "tuple"}),
    "timezone": frozenset({"blob", "tuple"}),
    "decimal": frozenset({"blob"}),
    "control_events": frozenset({"blob"}),
    "system_time": frozenset({"blob"}),
    "db_version": frozenset({"blob"}),
    "max_message_bytes": frozenset({"pb"}),  # only Envelope output has a message size
    "max_line_bytes": frozenset({"lines"}),  # only JSON Lines input (Blob, dts-json, Tuple) has lines
    "tuple_binary": frozenset({"tuple"}),
    "source_table": frozenset({"tuple"}),
    "zero_dates": frozenset({"blob", "tuple"}),  # Blob: strict mode's (lossless keeps every value as sent)
    "temporal_precision": frozenset({"blob", "tuple"}),
}
# Options that act on Blob data in strict mode only (and on Tuple data): the temporal policies.
STRICT_BLOB_OPTIONS = frozenset({"zero_dates", "temporal_precision"})
# Spark's PERMISSIVE ("keep") has no file counterpart: a kept record would need an error column.
CLI_CHOICES = {"on_error": ("fail", "skip")}
CLI_HELP = {"on_error": "bad records: stop at the first (exit 1), or skip and count them (see --rejects)"}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_option_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("conversion options (bridge.Options)")
    for name, type_name, default, choices, text in option_specs():
        choices = CLI_CHOICES.get(name, choices)
        text = CLI_HELP.get(name, text)
        kwargs: dict[str, Any] = {"dest": "opt_" + name, "default": argparse.SUPPRESS}
        if type_name == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
            kwargs["help"] = f"{text} (default: {'on' if default else 'off'})"
        else:
            kwargs["type"] = int if type_name == "int" else str
            if choices:
                kwargs["choices"] = choices
            shown = "" if default is None else f" (default: {default if default != '' else 'none'})"
            kwargs["help"] = text + shown
            kwargs["metavar"] = "|".join(choices) if choices else name.split("_")[-1].upper()
        group.add_argument(_flag(name), **kwargs)


def options_from(args: argparse.Namespace, sides: set) -> Options:
    given = {k[4:]: v for k, v in vars(args).items() if k.startswith("opt_")}
    for name in given:
        where = OPTION_SIDES.get(name)
        if where is not None and not where & sides:
            raise UsageError(f"option {_flag(name)} has no effect on this conversion "
                             f"(it applies to {' or '.join(sorted(where))} data)")
    try:
        options = Options(**given)
    except OptionsError as err:
        raise UsageError(str(err)) from None
    policies = sorted(STRICT_BLOB_OPTIONS & set(given))
    if policies and "tuple" not in sides and not options.strict:
        raise UsageError(f"option {_flag(policies[0])} has no effect without --strict on Blob data "
                         "(lossless Blob keeps every value as sent)")
    return options


def add_pipeline_flags(parser, names: tuple[str, ...] | None = None, help: dict | None = None) -> None:
    """Flags for the pipeline options (`bridge.pipeline.options`) of `names` (default: all the CLI
    takes), generated from their declarations: the flag, type, choices, default and help."""
    for name, kind, default, choices, _, text in pipeline_option_specs("cli"):
        if names is not None and name not in names:
            continue
        text = (help or {}).get(name, text)
        kwargs: dict[str, Any] = {"dest": "pipe_" + name, "default": argparse.SUPPRESS}
        if kind is bool:
            kwargs["action"] = "store_false" if default else "store_true"
            text = f"turn off (on by default): {text}" if default else text
        else:
            kwargs["type"] = kind
            if choices:
                kwargs["choices"] = choices
            kwargs["metavar"] = "|".join(choices) if choices else ("SECONDS" if kind is float else "N")
            if default is not None:
                text = f"{text} (default: {default:g})" if kind is float else f"{text} (default: {default})"
        parser.add_argument(cli_flag(name), help=text, **kwargs)


def pipeline_options_from(args: argparse.Namespace, **given) -> PipelineOptions:
    """The pipeline options of a command's flags (and `given`), validated once: a bad value is a
    usage error naming the flag."""
    given = {**{k[5:]: v for k, v in vars(args).items() if k.startswith("pipe_")}, **given}
    try:
        return PipelineOptions(**given)
    except OptionsError as err:
        for name in given:
            if f"option {name!r}" in str(err):
                raise UsageError(str(err).replace(f"option {name!r}", cli_flag(name).replace("--no-", "--"), 1)) \
                    from None
        raise UsageError(str(err)) from None


# ---- rejects, ledger and help text ---------------------------------------------------------------

LEDGER_HELP = ("the loss ledger: one JSON line per value a temporal policy (--zero-dates, --temporal-precision) "
               "substituted (position, column, kind, value sent, value written); the summary line counts them "
               "either way")


def ledger_sink(out) -> Callable[[dict], None] | None:
    """Writes each loss-ledger record (a value a temporal policy substituted) as a JSON line."""
    if out is None:
        return None
    return lambda record: out.write(orjson.dumps(record, default=str) + b"\n")


def rejects_sink(out, tally: Tally) -> Callable[[dict], None] | None:
    """Writes each rejection as a JSON line; `records` says how many input records it disposes
    of (a broken run of segments is one rejection of several Envelopes)."""
    if out is None:
        return None
    counted = [tally.rejected]

    def sink(record: dict) -> None:
        record["records"], counted[0] = tally.rejected - counted[0], tally.rejected  # policy counts first
        out.write(orjson.dumps(record, default=str) + b"\n")
    return sink


def _epilog(*examples: str) -> str:
    return "example:\n" + "\n".join(f"  {e}" for e in examples)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's example lines as written; descriptions are wrapped by `_describe`."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def _describe(text: str) -> str:
    return textwrap.fill(" ".join(text.split()), width=90)


def check_output_dir(template: str, mkdir: bool) -> None:
    """The directory of -o (the part before any {placeholder}) must exist, unless --mkdir: a
    mistyped path is an error, not a tree of new directories."""
    folder = os.path.dirname(template.split("{", 1)[0])
    if not folder or os.path.isdir(folder):
        return
    if not mkdir:
        raise UsageError(f"the output directory {folder} does not exist (create it, or pass --mkdir)")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create {folder}: {err.strerror}") from None
