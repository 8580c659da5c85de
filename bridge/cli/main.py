"""The `dts-bridge` command line (also `python -m bridge`): a thin face over the library.

Every command streams its input one record at a time, so memory stays flat with file size.
Conversion goes through `bridge.stream`, where the error policy and the accounting law
(`converted + rejected + not emitted == input records`) live; this module only picks formats,
builds `Options` from flags declared once in `bridge.options.option_specs()`, and turns library
errors into one-line messages, here and nowhere else.

Exit codes: 0 success; 1 data errors (any rejected record, or the first bad record under
`--on-error fail`, or an internal error); 2 usage errors (flags, formats, unreadable input).

>>> main(["validate", "--help"]) == 0  # doctest: +ELLIPSIS
usage: dts-bridge validate ...
True
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import pathlib
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson

from bridge.blob.decode import decode_blob
from bridge.blob.encode import BlobEncoder
from bridge.blob.validation import iter_blob_errors
from bridge.cli import observe
from bridge.cli.base import (
    CLI_CHOICES,
    DEBUG_ENV,
    EXTENSIONS,
    FORMATS,
    FRAMING_NAMES,
    LEDGER_HELP,
    OPTION_SIDES,
    PROG,
    UsageError,
    _describe,
    _epilog,
    _Formatter,
    _one_line,
    _Outputs,
    add_option_flags,
    check_output_dir,
    ledger_sink,
    options_from,
    rejects_sink,
    resolve_format,
)
from bridge.cli.deliver import register as register_deliver
from bridge.cli.kafka import register as register_kafka
from bridge.cli.sync import register as register_sync
from bridge.cli.tuple import SCHEMA_SUFFIX, TABLE_PLACEHOLDER, TupleFiles, _tuple_input, _tuple_module
from bridge.errors import BridgeError, DecodeError
from bridge.options import Options
from bridge.stream import (
    ErrorPolicy,
    Tally,
    blob_lines_to_entries,
    counted,
    dts_json_lines_to_entries,
    dts_records_to_entries,
    entries_to_messages,
    tuple_rows_to_entries,
)
from bridge.stream.census import Census, CountingReassembler
from bridge.tuple.files import tuple_converter
from bridge.values import SUBSTITUTIONS
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import iter_pb_messages, pack_entries, read_dts_json, read_lines, write_dts_json, write_pb

# The format and option tables live in bridge.cli.base (every command group reads them); they
# stay importable from here, where the CLI's readers look for them.
__all__ = ["main", "build_parser", "EXTENSIONS", "FORMATS", "OPTION_SIDES", "CLI_CHOICES", "options_from"]


# ---- input and output streams -------------------------------------------------------------------

def _open_input(path: str, stack: contextlib.ExitStack):
    if path == "-":
        return sys.stdin.buffer
    try:
        return stack.enter_context(open(path, "rb"))
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror}") from None


def pb_envelopes(stream, policy: ErrorPolicy, source: str) -> Iterator[tuple[int, int, bytes]]:
    """(partition 0, Envelope number in the file, bytes) of a `.pb` stream.

    A broken tail (a truncated length prefix or body) loses the framing: it is one rejected
    record and ends the stream; everything before it is converted as usual.
    """
    try:
        for number, _, raw in iter_pb_messages(stream, source):
            yield 0, number, raw
    except DecodeError as err:
        policy.tally.envelopes += 1
        policy.reject_input(err)


# ---- inspect's .pb reading: a file that is (partly) no DTS stream ------------------------------
#
# `inspect` reads on past errors (convert stops at the first), so garbage must not cost an error
# per byte: a zero byte frames as an empty message, and a zero-filled file would be a million
# "Envelope version 0" errors per MB. The rule: GARBAGE_RUN messages in a row that are no Envelope,
# or a length prefix that breaks the framing, start a stretch of bytes that look like no DTS
# stream. From the byte after its start, the next Envelope is looked for by how an Envelope that
# carries data begins, as protobuf writes its fields in order: its length prefix, then version 1
# (0x08 0x01), total (0x10, at least 1), index (0x18, below total) unless 0, then data (0x22) whose
# length fits in the message. The stretch is one error, "N bytes from byte X on look like no DTS
# stream", and reading goes on at that Envelope, or ends with the input. A framing error at the
# very end with nothing bad before it (a truncated last message) stays the error it is. Garbage
# costs a regular-expression search (about 0.01 s per MB); bytes built to look like Envelope
# headers every few bytes cost up to ~0.6 s per MB (each looked at in Python).

GARBAGE_RUN = 16
_MARK = b"\x08\x01\x10"  # field 1 (version) = 1, then the tag of field 2 (total)
# what a search needs to find (in C, at bytes.find's speed): version 1, a total of at least 1, an
# index of at least 1 or none (protobuf leaves index 0 out), then data (field 4) and its length
_HEAD = re.compile(rb"\x08\x01\x10[\x80-\xff]{0,4}[\x01-\x7f](?:\x18[\x80-\xff]{0,4}[\x01-\x7f])?"
                   rb"\x22[\x80-\xff]{0,4}[\x00-\x7f]")
_SCAN_CHUNK = 1 << 20


class _Replay:
    """`read(size)` over a binary stream that keeps what it read since `mark()` and takes bytes back."""

    def __init__(self, stream) -> None:
        self._read = stream.read
        self._back, self._at = b"", 0
        self.pos = 0
        self._kept: list | None = None
        self.mark_pos = 0

    def read(self, size: int) -> bytes:
        if self._at < len(self._back):
            part = self._back[self._at:self._at + size]
            self._at += len(part)
        else:
            part = self._read(size)
        if part:
            self.pos += len(part)
            if self._kept is not None:
                self._kept.append(part)
        return part

    def mark(self) -> None:
        self._kept, self.mark_pos = [], self.pos

    def take(self) -> bytes:
        """The bytes read since `mark()`; keeping stops."""
        data, self._kept = b"".join(self._kept or ()), None
        return data

    def give_back(self, data: bytes) -> None:
        self._back, self._at = data + self._back[self._at:], 0
        self.pos -= len(data)


def _varint_at(buf, at: int, end: int) -> tuple[int, int] | None:
    value = shift = 0
    while at < end and shift < 64:
        byte = buf[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7
    return None


def _starts_envelope(buf, at: int, size: int) -> bool:
    """Whether a message of `size` bytes at `at` begins as an Envelope does (version 1, total >= 1,
    an index below it, data inside the message): the resynchronization rule, on the header alone
    (`buf` may end before the message does)."""
    end = at + size
    if size < 4 or buf[at:at + 3] != _MARK:
        return False
    got = _varint_at(buf, at + 3, min(end, len(buf)))
    if got is None or got[0] < 1:
        return False
    total, j = got
    if j == end:
        return True  # no index, no data
    if j >= len(buf):
        return False
    if buf[j] == 0x18:
        got = _varint_at(buf, j + 1, min(end, len(buf)))
        if got is None or got[0] >= total:
            return False
        j = got[1]
    if j == end:
        return True  # no data
    if j >= len(buf) or buf[j] != 0x22:
        return False
    got = _varint_at(buf, j + 1, min(end, len(buf)))
    return got is not None and got[1] + got[0] <= end


def _next_envelope(reader: _Replay, buf: bytes, start: int) -> int | None:
    """The position of the next Envelope start in `buf` (the bytes from `start` on) and what
    `reader` reads after it, whose bytes from there are handed back to `reader`; None at the end."""
    base, at = start, 0
    while True:
        found = _HEAD.search(buf, at)
        if found is None or found.start() > len(buf) - 16:  # a header across the chunks: read on first
            more = reader.read(_SCAN_CHUNK)
            if not more:
                if found is None:
                    return None
            else:
                keep = min(len(buf), 32)  # a header across the chunks, and the length prefix before one
                base += len(buf) - keep
                buf = buf[len(buf) - keep:] + more
                at = 0
                continue
        i = found.start()
        while len(buf) - i < 64:  # the header whole (or the end)
            more = reader.read(_SCAN_CHUNK)
            if not more:
                break
            buf += more
        for k in range(1, min(5, i) + 1):  # the length prefix before the mark, 1 to 5 bytes
            head = buf[i - k:i]
            if any(b < 0x80 for b in head[:-1]) or head[-1] >= 0x80:
                break
            if _starts_envelope(buf, i, _varint_at(head, 0, k)[0]):
                reader.give_back(buf[i - k:])
                return base + i - k
        at = i + 1


def _envelope_like(raw: bytes) -> bool:
    env = pb.Envelope()
    try:
        env.ParseFromString(raw)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError, or worse: not an Envelope either way
        return False
    return env.version == 1 and env.total >= 1 and env.index < env.total


def inspect_envelopes(stream, policy: ErrorPolicy, source: str) -> Iterator[tuple[int, int, bytes]]:
    """`pb_envelopes` for inspect: (partition 0, message number, bytes), where a stretch of bytes
    that look like no DTS stream is one rejected record (the rule above), read past at the speed
    of `bytes.find`, not framed message by message."""
    reader = _Replay(stream)
    number = 0
    pending: list[tuple[int, bytes]] = []  # messages that are no Envelope, not yet handed on
    while True:
        frames, base, first = iter_pb_messages(reader, source), reader.pos, number
        broke: DecodeError | None = None
        while True:
            if not pending:
                reader.mark()
            try:
                item = next(frames, None)
            except DecodeError as err:  # its message and byte counted from where framing (re)started
                broke = err.located()
                broke.where.update(message=first + err.where.get("message", 0), byte=base + err.where.get("byte", 0))
                break
            if item is None:
                break
            raw = item[2]
            if _envelope_like(raw):
                for held in pending:
                    yield (0, *held)
                pending = []
                yield 0, number, raw
            else:
                pending.append((number, raw))
            number += 1
            if len(pending) >= GARBAGE_RUN:
                break
        if broke is None and len(pending) < GARBAGE_RUN:  # the end of the input
            for held in pending:
                yield (0, *held)
            return
        start = reader.mark_pos
        data = reader.take()
        found = _next_envelope(reader, data[1:], start + 1)
        end = found if found is not None else reader.pos
        if broke is not None and not pending and found is None:
            policy.tally.envelopes += 1
            policy.reject_input(broke)  # a broken last message, as convert says it
            return
        cause = ("" if not pending else "a message that is no DTS Envelope" if len(pending) == 1
                 else f"{len(pending)} messages in a row that are no DTS Envelope")
        if broke is not None:
            cause += (", then " if cause else "") + broke.reason
        after = f"the next Envelope starts at byte {found}" if found is not None else "no Envelope starts in them"
        policy.reject_input(DecodeError(f"{end - start} bytes from byte {start} on look like no DTS stream "
                                        f"({cause}; {after})", source=source))
        pending = []
        if found is None:
            return


# ---- convert ------------------------------------------------------------------------------------

def _source_entries(side: str, framing: str, path: str, fh, policy: ErrorPolicy, options: Options,
                    source: str, args, raw: bool = False) -> Iterator[tuple]:
    """(where, Entry) of the input under the policy; the tally counts input records. `raw`: .pb
    input also gives each Entry's bytes, (where, Entry, bytes), for the encoder's C fast path."""
    if side == "dts" and framing == "pb":
        return dts_records_to_entries(pb_envelopes(fh, policy, source), policy, raw=raw)
    if side == "dts":
        return dts_json_lines_to_entries(read_dts_json(fh, source, options.max_line_bytes), policy, source)
    if side == "blob":
        return blob_lines_to_entries(read_lines(fh, options.max_line_bytes, source), policy, options, source)
    (schema, table, columns), rows = _tuple_input(framing, path, fh, args, options.max_line_bytes)
    try:
        decoder = _tuple_module().TupleDecoder(schema, options, table=table, columns=columns)
    except BridgeError as err:
        raise UsageError(f"the RecordSchema does not fit: {err}") from None
    return tuple_rows_to_entries(rows, decoder, policy)


def _weighted(entries: Iterable[tuple[dict, pb.Entry]], tally: Tally) -> Iterator[tuple[int, dict, pb.Entry]]:
    """(input records behind it, where, Entry) for a source that counts converted records itself
    (Blob messages, Tuple rows): the records an Entry completes are the growth of `converted`."""
    last = tally.converted
    for where, entry in entries:
        weight, last = tally.converted - last, tally.converted
        yield weight, where, entry


def _chain(entries: Iterable[tuple[dict, pb.Entry]], convert: Callable[[pb.Entry], list], policy: ErrorPolicy,
           first: Tally) -> Iterator[tuple[dict, Any]]:
    """Second stage of Blob -> Tuple and Tuple -> Blob: an Entry the target rejects, or that gives
    no output, takes its input records from converted to rejected or not emitted, so the
    accounting stays in input records (a candidate for bridge.stream)."""
    second = policy.tally
    for weight, where, entry in _weighted(entries, first):
        try:
            outputs = counted(policy, where, convert, entry)
        except BridgeError as err:
            err.located(**{k: v for k, v in where.items() if k in ("partition", "offset", "line", "row")})
            policy.reject(err, entry.SerializeToString(), count=weight)
            continue
        if not outputs:
            second.not_emitted += weight
        for index, item in enumerate(outputs):
            second.outputs += 1
            yield {**where, "row": index}, item


def _merge(first: Tally, second: Tally) -> Tally:
    moved = second.rejected + second.not_emitted
    return Tally(input=first.input, converted=first.converted - moved, rejected=first.rejected + second.rejected,
                 not_emitted=first.not_emitted + second.not_emitted, outputs=second.outputs,
                 envelopes=first.envelopes,
                 **{kind: getattr(first, kind) + getattr(second, kind) for kind in SUBSTITUTIONS})


def _write_blob(items: Iterable[tuple[dict, bytes]], out) -> str:
    """Messages as JSON lines (what `BlobEncoder.convert_lines` gives)."""
    for _, line in items:
        out.write(line)
        out.write(b"\n")
    return ""


def _write_dts(items: Iterable[tuple[dict, pb.Entry]], out, framing: str, options: Options) -> str:
    entries = (entry for _, entry in items)
    if framing == "pb":
        count = write_pb(out, pack_entries(entries, options.max_message_bytes))
        return f" in {count} Envelope{'s' if count != 1 else ''}"
    write_dts_json(out, entries)
    return ""


def _write_tuples(items, files: TupleFiles) -> str:
    for _, item in items:
        files.write(item)
    count = files.close()
    return f" to {count} file{'s' if count != 1 else ''}" if files.path != "-" else ""


def _check_convert_args(args, src: tuple[str, str], dst: tuple[str, str]) -> None:
    src_side, dst_side = src[0], dst[0]
    if src_side == dst_side and src_side != "dts":
        raise UsageError(f"input and output are both {src_side}: nothing to convert")
    if TABLE_PLACEHOLDER in args.output and dst_side != "tuple":
        raise UsageError(f"{TABLE_PLACEHOLDER} in -o only applies to --to tuple (one file per table)")
    if args.table and "tuple" not in (src_side, dst_side):
        raise UsageError("--table applies to Tuple input or output")
    if args.schema and src_side != "tuple":
        raise UsageError("--schema applies to Tuple input")
    if args.rejects and getattr(args, "opt_on_error", "fail") != "skip":
        raise UsageError("--rejects needs --on-error skip (under fail the first bad record stops the run)")
    if args.output == "-" and dst[1] in ("pb", "parquet") and sys.stdout.isatty():
        raise UsageError(f"will not write {FRAMING_NAMES[dst[1]]} to a terminal: pass -o OUTPUT")
    if args.output == "-" and dst[1] in ("csv", "parquet"):
        raise UsageError(f"{FRAMING_NAMES[dst[1]]} output needs a file (-o); stdout takes Tuple JSON Lines")


def cmd_convert(args: argparse.Namespace) -> int:
    if args.to is None and args.output == "-":
        raise UsageError("pass --to blob|tuple|dts (or an -o OUTPUT whose name tells the format)")
    src_side, src_framing = resolve_format(args.input, args.from_, "--from")
    dst_side, dst_framing = resolve_format(args.output.replace(TABLE_PLACEHOLDER, "t"), args.to, "--to")
    _check_convert_args(args, (src_side, src_framing), (dst_side, dst_framing))
    options = options_from(args, {src_side, dst_side} | ({"pb"} if dst_framing == "pb" else set())
                           | ({"lines"} if src_framing in ("json", "jsonl") else set()))
    # a mistyped -o is an error, not a tree of new directories
    for target in (args.output, args.rejects, args.ledger):
        # a {table} template names a folder of outputs: that folder is made (docs/cli.md)
        if target and target != "-" and "{" not in target:
            check_output_dir(target, args.mkdir)
    on_error = getattr(args, "opt_on_error", "fail")
    source = "<stdin>" if args.input == "-" else args.input
    label = f"{PROG} convert {source}"

    tally, second = Tally(), Tally()
    outputs = _Outputs()
    progress = observe.progress(unit="records", enabled=False if args.no_progress else None, desc=label,
                                describe=lambda: f"{tally.input:,} read, {tally.rejected:,} rejected")
    with contextlib.ExitStack() as stack, _locating(source):
        fh = _open_input(args.input, stack)
        rejects = outputs.open(args.rejects) if args.rejects else None
        ledger = ledger_sink(outputs.open(args.ledger) if args.ledger else None)
        policy = ErrorPolicy(on_error, tally=tally, sink=rejects_sink(rejects, tally), keep_records=False,
                             ledger=ledger, name_entry=True)
        try:
            entries = _source_entries(src_side, src_framing, args.input, fh, policy, options, source, args,
                                      raw=dst_side == "blob")
            # stream_lines, stream=True: the lines or rows of an Entry are never all held (one Entry
            # can give gigabytes)
            convert = (BlobEncoder(options).stream_lines if dst_side == "blob" else
                       tuple_converter(options, args.table, stream=True) if dst_side == "tuple"
                       else lambda entry: [entry])
            if src_side == "dts":
                items = entries_to_messages(entries, convert, policy)
            elif dst_side == "dts":
                items = entries  # Blob and Tuple sources count converted records themselves
            else:
                items = _chain(entries, convert, ErrorPolicy(on_error, tally=second, keep_records=False,
                                                             sink=rejects_sink(rejects, second), ledger=ledger),
                               tally)
            items = progress.wrap(items)
            if dst_side == "blob":
                written = _write_blob(items, outputs.open(args.output))
            elif dst_side == "dts":
                written = _write_dts(items, outputs.open(args.output), dst_framing, options)
            else:
                written = _write_tuples(items, TupleFiles(args.output, dst_framing, options, outputs))
        except BaseException:
            progress.clear()
            outputs.abort()
            raise
        outputs.commit()
    progress.clear()
    report = _merge(tally, second) if "dts" not in (src_side, dst_side) else tally
    sys.stdout.flush()
    print(f"{label}: {report.summary(written)}", file=sys.stderr)
    return 1 if report.rejected else 0


@contextlib.contextmanager
def _locating(source: str):
    """Name the input file in a record error that does not name it yet."""
    try:
        yield
    except BridgeError as err:
        raise err.located(source=source)


# ---- inspect ------------------------------------------------------------------------------------

def cmd_inspect(args: argparse.Namespace) -> int:
    side, framing = resolve_format(args.input, args.from_, "--from")
    if side == "tuple":
        raise UsageError("inspect reads .pb, dts-json and Blob JSON Lines files")
    source = "<stdin>" if args.input == "-" else args.input
    census = Census("Blob messages" if side == "blob" else "Entries")
    tally = Tally()
    policy = ErrorPolicy("skip", tally=tally,
                         sink=lambda record: census.error(record, _one_line(record_message(record))),
                         keep_records=False)
    with contextlib.ExitStack() as stack:
        fh = _open_input(args.input, stack)
        if side == "blob":
            bar = stack.enter_context(_inspect_progress(tally, source))
            for number, line in bar.wrap(read_lines(fh, source=source)):
                tally.input += 1
                try:
                    if isinstance(line, BridgeError):  # longer than the default max_line_bytes
                        raise line
                    census.blob(decode_blob(line, line=number))
                except BridgeError as err:
                    policy.reject(err, line)
        else:
            reassembler = CountingReassembler()
            if framing == "pb":
                entries = dts_records_to_entries(inspect_envelopes(fh, policy, source), policy, reassembler)
            else:
                entries = dts_json_lines_to_entries(read_dts_json(fh, source), policy, source)
            bar = stack.enter_context(_inspect_progress(tally, source))
            for _, entry in bar.wrap(entries):
                census.entry(entry)
            if framing == "pb":
                census.framing = {"envelopes": tally.envelopes, "entries_messages": reassembler.bundles,
                                  "split_entries": reassembler.split, "segments_of_split": reassembler.segments}
    if args.json:
        sys.stdout.write(orjson.dumps({"source": source, **census.as_dict()}, option=orjson.OPT_INDENT_2).decode())
        sys.stdout.write("\n")
    else:
        print(census.text(source))
    return 1 if census.errors else 0


def _inspect_progress(tally: Tally, source: str):
    """The one progress display (observe.progress: a tqdm bar on a terminal, nothing elsewhere)."""
    from bridge.cli import observe
    return observe.progress(unit="records", desc=f"{PROG} inspect {source}",
                            describe=lambda: f"{tally.input:,} read, {tally.rejected:,} rejected")


def record_message(record: dict) -> str:
    where = ", ".join(f"{k} {v}" for k, v in record.items()
                      if k not in ("kind", "reason", "value", "raw", "raw_base64", "raw_truncated_from"))
    return f"{record['reason']} ({where})" if where else record["reason"]


# ---- validate, samples, demo -------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace) -> int:
    source = "<stdin>" if args.file == "-" else args.file
    messages = invalid = 0
    with contextlib.ExitStack() as stack:
        fh = _open_input(args.file, stack)
        progress = stack.enter_context(observe.progress(
            unit="messages", enabled=False if args.no_progress else None, desc=f"{PROG} validate {source}",
            describe=lambda: f"{invalid:,} invalid"))
        for number, line in progress.wrap(read_lines(fh, source=source)):
            messages += 1
            try:
                problems = [line.reason] if isinstance(line, BridgeError) else iter_blob_errors(orjson.loads(line))
            except orjson.JSONDecodeError as err:
                problems = [f"invalid JSON ({err.msg})"]
            if problems:
                invalid += 1
                for problem in problems:
                    print(f"{source}:{number}: {_one_line(problem)}")
    sys.stdout.flush()
    print(f"{PROG} validate {source}: {messages} messages, {invalid} invalid", file=sys.stderr)
    return 1 if invalid else 0


def cmd_samples(args: argparse.Namespace) -> int:
    from bridge.samples import write_samples
    # DIR is made when its parent folder exists, as -o makes its file in an existing folder; a
    # missing parent is a mistyped path, not a tree of new directories, unless --mkdir
    folder = args.dir.rstrip("/") or args.dir
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"{args.dir} is not a directory")
    check_output_dir(folder, args.mkdir)
    kwargs = {} if args.max_message_bytes is None else {"max_message_bytes": args.max_message_bytes}
    paths = write_samples(args.dir, **kwargs)
    for path in paths:
        print(path)
    sys.stdout.flush()
    print(f"{PROG} samples: wrote {len(paths)} files to {args.dir}", file=sys.stderr)
    return 0


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cmd_demo(args: argparse.Namespace) -> int:
    """Every conversion must be clean: Blob output is lossless, and the Tuple conversions' default
    temporal policies write the values a Tuple row cannot hold (zero dates, dates beyond DataHub's
    TIMESTAMP range) as NULL, each listed in a ledger file; a record rejected all the same goes to
    a rejects file and makes the exit code 1."""
    samples = pathlib.Path(args.samples_dir)
    inputs = sorted(samples.glob("*.pb"))
    if not inputs:
        raise UsageError(f"no .pb files in {samples} (write some with: {PROG} samples {samples})")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # the demo's own folder
    tuples = _have("bridge.tuple")
    status = 0
    for path in inputs:
        status = max(status, main(["convert", str(path), "-o", str(out / f"{path.stem}.blob.jsonl")]))
        if tuples:
            folder = out / f"{path.stem}.tuple"
            code = main(["convert", str(path), "-o", str(folder / f"{TABLE_PLACEHOLDER}.jsonl"), "--to", "tuple",
                         "--on-error", "skip", "--rejects", str(folder / "rejects.jsonl"), "--mkdir",
                         "--ledger", str(folder / "ledger.jsonl")])  # zero dates written as NULL, each named
            status = max(status, code)
    print(f"{PROG} demo: output in {out}/", file=sys.stderr)
    if not tuples:
        print(f"{PROG} demo: Tuple output skipped: bridge.tuple is not installed", file=sys.stderr)
    if not _have("pyspark"):
        print(f"{PROG} demo: pyspark is not installed; skipping the Spark summary "
              "(pip install 'dts-datahub-bridge[spark]')", file=sys.stderr)
        return status
    try:
        demo = importlib.import_module("bridge.cli.demo")
    except ModuleNotFoundError as err:
        if err.name != "bridge.cli.demo":
            raise
        print(f"{PROG} demo: bridge.cli.demo is not available; skipping the Spark summary", file=sys.stderr)
        return status
    try:
        summary = demo.spark_summary(str(samples))
    except Exception as err:  # noqa: BLE001 - Spark needs Java 17; say so in one line
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"{PROG} demo: the Spark summary failed: {type(err).__name__}: {_one_line(err)[:300]}",
              file=sys.stderr)
        return max(status, 1)
    if summary is not None:
        print(summary)
    return status


# ---- the parser and the boundary ---------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other error (the full usage is one --help away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, formatter_class=_Formatter,
        description=_describe("Convert Tencent Cloud DTS subscription messages to Alibaba Cloud DataHub "
                    "Blob/Tuple messages and back."),
        epilog=_epilog(f"{PROG} convert samples/mixed.pb -o mixed.jsonl --to blob"))
    parser.add_argument("--version", action="version", version=f"{PROG} {observe.bridge_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    convert = commands.add_parser(
        "convert", formatter_class=_Formatter, help="convert between DTS (.pb, dts-json), Blob and Tuple files",
        description=_describe("Convert a file record by record. Formats come from the file names (.pb, .dts.jsonl, "
                    ".jsonl, .csv, .parquet) or from --from/--to; '-' is stdin/stdout. Bad records stop the "
                    "run (--on-error fail) or are counted and written to --rejects (--on-error skip). "
                    "A one-line summary goes to stderr."),
        epilog=_epilog(f"{PROG} convert samples/mixed.pb -o mixed.jsonl --to blob",
                       f"{PROG} convert mixed.jsonl -o mixed.pb --on-error skip --rejects rejects.jsonl",
                       f"{PROG} convert samples/mixed.pb -o 'tuple/{{table}}.csv' --to tuple"))
    convert.add_argument("input", metavar="INPUT", help="input file, or - for stdin (with --from)")
    convert.add_argument("-o", "--output", default="-", metavar="OUTPUT",
                         help="output file (default: stdout, with --to); for --to tuple, a name containing "
                              "{table} gives one file per table")
    convert.add_argument("--from", dest="from_", choices=tuple(FORMATS), help="input format (default: from INPUT)")
    convert.add_argument("--to", choices=tuple(FORMATS), help="output format (default: from OUTPUT)")
    convert.add_argument("--table", metavar="DB.TABLE",
                         help="Tuple output: only this table; Tuple input: the table the rows belong to")
    convert.add_argument("--schema", metavar="PATH",
                         help=f"Tuple input: its RecordSchema JSON (default: NAME{SCHEMA_SUFFIX} next to INPUT, "
                              "or the Parquet file's own)")
    convert.add_argument("--rejects", metavar="PATH",
                         help="with --on-error skip: write one JSON line per rejected record "
                              "(position, reason, raw input)")
    convert.add_argument("--ledger", metavar="PATH", help=LEDGER_HELP)
    convert.add_argument("--mkdir", action="store_true",
                         help="create the directory of -o (and --rejects) when it does not exist (default: an error)")
    convert.add_argument("--no-progress", action="store_true",
                         help="no progress display (there is one only when stderr is a terminal)")
    add_option_flags(convert)
    convert.set_defaults(run=cmd_convert)

    inspect = commands.add_parser(
        "inspect", formatter_class=_Formatter, help="count what a DTS or Blob file holds",
        description=_describe("Count records by message type, op, table and row-image kind (full, minimal with NA, "
                    "none), Envelopes and split Entries, and errors. Exit 1 when the file has errors."),
        epilog=_epilog(f"{PROG} inspect samples/large.pb --json"))
    inspect.add_argument("input", metavar="INPUT", help=".pb, .dts.jsonl or Blob .jsonl file, or - (with --from)")
    inspect.add_argument("--from", dest="from_", choices=("dts", "dts-json", "blob"), help="input format")
    inspect.add_argument("--json", action="store_true", help="print the counts as one JSON document")
    inspect.set_defaults(run=cmd_inspect)

    validate = commands.add_parser(
        "validate", formatter_class=_Formatter, help="check Blob JSON Lines against the Blob schema",
        description=_describe("Check every line of a Blob JSON Lines file against bridge/blob/blob.schema.json and the "
                    "declared column types; print FILE:LINE: problem for each. Exit 1 if any is invalid."),
        epilog=_epilog(f"{PROG} validate mixed.jsonl"))
    validate.add_argument("file", metavar="FILE", help="Blob JSON Lines file, or - for stdin")
    validate.add_argument("--no-progress", action="store_true",
                          help="no progress display (there is one only when stderr is a terminal)")
    validate.set_defaults(run=cmd_validate)

    samples = commands.add_parser(
        "samples", formatter_class=_Formatter, help="write the sample DTS streams",
        description=_describe("Write the deterministic sample streams (NAME.pb and NAME.dts.jsonl) into DIR."),
        epilog=_epilog(f"{PROG} samples samples/"))
    samples.add_argument("dir", metavar="DIR",
                         help="output directory (created when missing, if the folder it is in exists)")
    samples.add_argument("--mkdir", action="store_true",
                         help="create the folders above DIR too when they do not exist (default: an error)")
    samples.add_argument("--max-message-bytes", type=int, metavar="BYTES",
                         help="Envelope size limit for every stream (default: each stream's own)")
    samples.set_defaults(run=cmd_samples)

    demo = commands.add_parser(
        "demo", formatter_class=_Formatter, help="convert every sample to Blob and Tuple (make demo)",
        description=_describe("Convert every .pb in SAMPLES_DIR to Blob and Tuple files in --out, print the summaries, "
                    "and, when pyspark is installed, a Spark summary."),
        epilog=_epilog(f"{PROG} demo samples --out out/"))
    demo.add_argument("samples_dir", metavar="SAMPLES_DIR", nargs="?", default="samples",
                      help="directory of sample .pb files (default: samples)")
    demo.add_argument("--out", default="out", metavar="DIR", help="output directory (default: out)")
    demo.set_defaults(run=cmd_demo)

    register_kafka(commands)  # the pipeline ends: consume, produce (docs/kafka.md)
    register_deliver(commands)  # files -> DataHub (docs/kafka.md, "deliver")
    register_sync(commands)  # Kafka -> DataHub in one process (docs/kafka.md)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (the console script passes it to sys.exit)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, or a usage error argparse already printed
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    prefix = f"{PROG} {args.command}"
    try:
        return args.run(args)
    except UsageError as err:
        print(f"{prefix}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except BridgeError as err:
        print(f"{prefix}: {_one_line(err)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep Python from complaining
        # again when it flushes stdout at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr)
        return 130
    except OSError as err:
        print(f"{prefix}: {_one_line(err)}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - the boundary: one line, unless debugging
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"{prefix}: internal error: {type(err).__name__}: {_one_line(err)} "
              f"(set {DEBUG_ENV}=1 for a traceback)", file=sys.stderr)
        return 1
