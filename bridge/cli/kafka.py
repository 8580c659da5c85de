"""The Kafka ends of `dts-bridge`: `consume` (Kafka -> files) and `produce` (.pb -> Kafka), with
the Kafka and reading flags `sync` shares (`deliver`, files -> DataHub, is bridge.cli.deliver).
Thin, like bridge.cli.main: the work is in bridge.kafka, the error policy and the accounting in
bridge.stream.

`consume` appends to its output (a run continues where the last commit left it) and makes it
durable before every offset commit; see docs/kafka.md for the commit rule.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import orjson
from google.protobuf import json_format

from bridge.blob.encode import BlobEncoder
from bridge.cli import observe
from bridge.cli.base import (
    LEDGER_HELP,
    PROG,
    UsageError,
    _describe,
    _epilog,
    _Formatter,
    _one_line,
    add_option_flags,
    check_output_dir,
    ledger_sink,
    options_from,
    rejects_sink,
    resolve_format,
)
from bridge.cli.tuple import TABLE_PLACEHOLDER, _tuple_module, _versioned, schema_path
from bridge.errors import BridgeError
from bridge.options import Options
from bridge.stream import ErrorPolicy, Tally
from bridge.stream.pipeline import Overlay, Report
from bridge.tuple.files import tuple_converter
from bridge.values import SUBSTITUTIONS
from bridge.wire.framing import entry_to_json_line, pack_entries, write_pb

__all__ = ["register", "cmd_consume", "cmd_produce"]

PARTITION_PLACEHOLDER = "{partition}"


# ---- Kafka connection flags, shared by consume and produce -------------------------------------

def _add_kafka_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Kafka connection")
    group.add_argument("--brokers", required=True, metavar="HOST:PORT[,...]", help="bootstrap servers")
    group.add_argument("--topic", required=True, help="the topic")
    group.add_argument("--security-protocol", metavar="PROTOCOL",
                       help="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (default: SASL_PLAINTEXT with a SASL user, "
                            "else PLAINTEXT)")
    group.add_argument("--sasl-mechanism", metavar="MECHANISM",
                       help="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default with a SASL user: SCRAM-SHA-512)")
    group.add_argument("--sasl-username", metavar="USER",
                       help="SASL user (default: $DTS_BRIDGE_SASL_USERNAME)")
    group.add_argument("--sasl-password", metavar="PASSWORD",
                       help="SASL password (default: $DTS_BRIDGE_SASL_PASSWORD; prefer the variable, "
                            "command lines are visible to other users)")
    group.add_argument("-X", dest="kafka_config", action="append", default=[], metavar="KEY=VALUE",
                       help="any other librdkafka setting (repeatable)")


def _kafka_config(args) -> dict:
    from bridge.kafka import SASL_PASSWORD_ENV, SASL_USERNAME_ENV, client_config
    extra = {}
    for item in args.kafka_config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"-X takes KEY=VALUE, not {item!r}")
        extra[key.strip()] = value
    return client_config(args.brokers, security_protocol=args.security_protocol, sasl_mechanism=args.sasl_mechanism,
                         sasl_username=args.sasl_username or os.environ.get(SASL_USERNAME_ENV),
                         sasl_password=args.sasl_password or os.environ.get(SASL_PASSWORD_ENV), extra=extra)


# ---- consume: outputs cut back to their committed length on restart ---------------------------

STATE_SUFFIX = ".consume-state.json"


def consume_state_path(args) -> str:
    """Where consume keeps its outputs' committed lengths: --state, else next to the outputs,
    named after -o (and after --partitions, so that one process per partition set keeps its own)."""
    if args.state:
        return args.state
    fixed = args.output.split("{", 1)[0]
    folder = os.path.dirname(fixed)
    rest = args.output[len(folder):].lstrip("/").replace("/", "_")
    parts = "" if args.partitions is None else ".p" + "-".join(str(p) for p in sorted(args.partitions))
    return os.path.join(folder, rest + parts + STATE_SUFFIX)


class _ResumableFiles:
    """Output files named from a template ({partition}, {table}), appended to, with their
    committed lengths in a state file (written atomically, see bridge.stream.state.replace_json).

    A file is registered in the state (at its current length, 0 when new) before it is first
    written; `mark(offsets)` records every file's length with the offsets being committed. On
    restart `restore()` cuts each file back to its committed length and removes those created
    after the last commit, so the run continues exactly where the commit left the output; the
    offsets in the state win over the store's (the state is written first)."""

    def __init__(self, template: str, state_path: str, identity: dict) -> None:
        self.template, self.state_path, self.identity = template, state_path, identity
        self.files: dict[str, Any] = {}
        self.lengths: dict[str, int] = {}  # every registered file -> its committed length
        self.offsets: dict[int, int] = {}  # the offsets committed with those lengths
        self.extra: dict = {}  # what the writer keeps across runs (Tuple: current versions)
        self.extra_state: Callable[[], dict] | None = None

    def path(self, partition=None, table=None) -> str:
        path = self.template.replace(PARTITION_PLACEHOLDER, str(partition))
        return path.replace(TABLE_PLACEHOLDER, str(table))

    # -- restart --------------------------------------------------------------------------------
    def restore(self) -> dict[int, int]:
        """Cut the outputs back to the last commit; returns the offsets committed with them."""
        try:
            with open(self.state_path, "rb") as fh:
                doc = orjson.loads(fh.read())
        except FileNotFoundError:
            return {}
        except (OSError, orjson.JSONDecodeError) as err:
            raise UsageError(f"cannot read the state file {self.state_path}: {_one_line(err)}") from None
        mine = {k: doc.get(k) for k in self.identity}
        if mine != self.identity:
            raise UsageError(f"the state file {self.state_path} belongs to another run ({_describe_identity(mine)}; "
                             f"this one: {_describe_identity(self.identity)}): pass another -o or --state")
        for path, length in doc.get("files", {}).items():
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                size = None
            if size is None or size < length:
                if length == 0:
                    continue
                raise BridgeError(f"{path} holds {'nothing' if size is None else f'{size} bytes'}, less than the "
                                  f"{length} bytes committed (changed outside {PROG}?); remove {self.state_path} "
                                  f"and start again")
            if length == 0:
                os.remove(path)  # created after the last commit
            elif size > length:
                with open(path, "r+b") as fh:
                    fh.truncate(length)
                    os.fsync(fh.fileno())
            self.lengths[path] = length
        self.offsets = {int(p): off for p, off in doc.get("partitions", {}).items()}
        self.extra = doc.get("writer", {})
        self._save()  # the removed files are out of it
        return dict(self.offsets)

    # -- writing ---------------------------------------------------------------------------------
    def register(self, path: str) -> None:
        """Record `path` before it is first written, so a crash before the next commit can undo it."""
        if path in self.lengths:
            return
        self.lengths[path] = os.path.getsize(path) if os.path.exists(path) else 0
        self._save()

    def get(self, path: str):
        fh = self.files.get(path)
        if fh is None:
            self.register(path)
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                fh = self.files[path] = open(path, "ab")
            except OSError as err:
                raise UsageError(f"cannot write {path}: {err.strerror}") from None
        return fh

    def sync(self) -> None:
        for fh in self.files.values():
            fh.flush()
            os.fsync(fh.fileno())

    def mark(self, offsets: dict[int, int]) -> None:
        """After `sync`: the files' lengths go with `offsets` (called before the offsets are stored)."""
        lengths = {path: (self.files[path].tell() if path in self.files else
                          os.path.getsize(path) if os.path.exists(path) else 0) for path in self.lengths}
        offsets = {**self.offsets, **offsets}
        extra = self.extra_state() if self.extra_state is not None else {}
        if lengths == self.lengths and offsets == self.offsets and extra == self.extra:
            return
        self.lengths, self.offsets, self.extra = lengths, offsets, extra
        self._save()

    def _save(self) -> None:
        from bridge.stream.state import replace_json
        doc = {**self.identity, "partitions": {str(p): off for p, off in sorted(self.offsets.items())},
               "files": self.lengths, "writer": self.extra}
        try:
            replace_json(self.state_path, doc)
        except OSError as err:
            raise UsageError(f"cannot write the state file {self.state_path}: {err.strerror}") from None

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()


def _describe_identity(identity: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in identity.items())


class _BlobOut:
    def __init__(self, files: _ResumableFiles) -> None:
        self.files = files

    def write(self, where: dict, line: bytes) -> None:
        self.files.get(self.files.path(where["partition"])).write(line + b"\n")

    def flush(self) -> None:
        self.files.sync()

    def mark(self, offsets: dict[int, int]) -> None:
        self.files.mark(offsets)


class _DtsOut(_BlobOut):
    """dts-json: one Entry per line; .pb: the Entries since the last sync packed into Envelopes."""

    def __init__(self, files: _ResumableFiles, framing: str, options: Options) -> None:
        super().__init__(files)
        self.framing, self.options = framing, options
        self.pending: dict[str, list] = {}

    def write(self, where: dict, entry) -> None:
        path = self.files.path(where["partition"])
        if self.framing == "json":
            self.files.get(path).write(entry_to_json_line(entry))
        else:
            self.pending.setdefault(path, []).append(entry)

    def flush(self) -> None:
        for path, entries in self.pending.items():
            write_pb(self.files.get(path), pack_entries(entries, self.options.max_message_bytes))
        self.pending.clear()
        self.files.sync()


class _TupleOut(_BlobOut):
    """Tuple JSON Lines, one file per table ({table} in -o) with NAME.schema.json next to it; a
    new RecordSchema continues in NAME.v2.jsonl, ... as `convert` does. The version each table
    writes is in the state, so a restart continues that file, not the first one whose
    RecordSchema matches."""

    def __init__(self, files: _ResumableFiles, options: Options) -> None:
        super().__init__(files)
        self.options, self.tup = options, _tuple_module()
        self.current: dict[str, tuple[int, str, list]] = {}  # base path -> (version, path, fields)
        for base, version in files.extra.get("versions", {}).items():
            path = _versioned(base, "jsonl", version)
            self.current[base] = (version, path, self._fields(schema_path(path, "jsonl")))
        files.extra_state = lambda: {"versions": {base: v for base, (v, _, _) in sorted(self.current.items())}}

    @staticmethod
    def _fields(side_path: str):
        try:
            with open(side_path, "rb") as fh:
                return orjson.loads(fh.read()).get("fields")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            return None

    def write(self, where: dict, item) -> None:
        table, columns, schema, row = item
        base = self.files.path(where["partition"], table)
        current = self.current.get(base)
        if current is None or current[2] != schema["fields"]:
            version = self._version(base, table, columns, schema, 1 if current is None else current[0] + 1)
            current = self.current[base] = (version, _versioned(base, "jsonl", version), schema["fields"])
        self.tup.write_tuple_jsonl([row], self.files.get(current[1]))

    def _version(self, base: str, table: str, columns, schema: dict, version: int) -> int:
        """The first version from `version` on whose RecordSchema is this one, else a new one."""
        while True:
            side_path = schema_path(_versioned(base, "jsonl", version), "jsonl")
            if not os.path.exists(side_path):
                break
            if self._fields(side_path) == schema["fields"]:
                return version
            version += 1
        side = {"table": table, **schema}
        if self.options.lossless:
            side["dtsColumns"] = [json_format.MessageToDict(c) for c in columns]
        self.files.register(side_path)  # a crash before the next commit removes it with its rows
        os.makedirs(os.path.dirname(os.path.abspath(side_path)), exist_ok=True)
        tmp = f"{side_path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(orjson.dumps(side, option=orjson.OPT_INDENT_2) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, side_path)
        return version


def _consume_side(args) -> tuple[str, str]:
    if args.output == "-":
        raise UsageError("consume needs an output file (-o): offsets are committed only once it is fsynced")
    side, framing = resolve_format(args.output.replace(PARTITION_PLACEHOLDER, "0").replace(TABLE_PLACEHOLDER, "t"),
                                   args.to, "--to")
    if side == "tuple" and framing != "jsonl":
        raise UsageError("consume writes Tuple rows as JSON Lines (.jsonl): CSV and Parquet files cannot be appended")
    if side == "tuple" and TABLE_PLACEHOLDER not in args.output and not args.table:
        raise UsageError(f"Tuple output needs {TABLE_PLACEHOLDER} in -o (one file per table) or --table DB.TABLE")
    if side != "tuple" and TABLE_PLACEHOLDER in args.output:
        raise UsageError(f"{TABLE_PLACEHOLDER} in -o only applies to --to tuple")
    return side, framing


def _consume_output(args, side: str, framing: str, options: Options):
    store = f"group {args.group}" if not args.offsets_file else f"offsets file {args.offsets_file}"
    files = _ResumableFiles(args.output, consume_state_path(args),
                            {"topic": args.topic, "store": store, "output": args.output})
    files.restore()
    if side == "blob":
        return files, _BlobOut(files), BlobEncoder(options).convert_lines
    if side == "dts":
        return files, _DtsOut(files, framing, options), (lambda entry: [entry])
    return files, _TupleOut(files, options), tuple_converter(options, args.table)


@contextlib.contextmanager
def _graceful_stop():
    """SIGINT / SIGTERM end the run at the next message: what is converted is written, fsynced
    and committed. A second signal is not special: the run is already stopping."""
    stopped = [False]

    def handler(signum, frame) -> None:
        stopped[0] = True
    saved = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            saved[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread: no signal handling, stop only by the other limits
        pass
    try:
        yield lambda: stopped[0]
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def _add_reading_flags(parser: argparse.ArgumentParser) -> None:
    """Where a Kafka-reading run starts, keeps its offsets and stops (consume and sync)."""
    parser.add_argument("--group", metavar="GROUP", help="consumer group: its committed offsets are where a run starts")
    parser.add_argument("--offsets-file", metavar="PATH",
                        help="keep offsets in this local JSON file instead of the group (brokers without group commits)")
    parser.add_argument("--partitions", type=lambda s: [int(p) for p in s.split(",")], metavar="P[,P...]",
                        help="read only these partitions (default: all)")
    parser.add_argument("--from-beginning", action="store_true",
                        help="with no committed offset, start at the earliest message (default: the latest)")
    parser.add_argument("--max-messages", type=int, metavar="N", help="stop after N Envelopes")
    parser.add_argument("--idle-timeout", type=float, metavar="SECONDS",
                        help="stop once every partition is read to its end and no message came for this long "
                             "(default: run until stopped)")
    parser.add_argument("--rejects", metavar="PATH", help="with --on-error skip: append one JSON line per rejected record")


def _check_reading_args(args) -> None:
    """The checks of `_add_reading_flags`' flags (consume and sync)."""
    if not args.group and not args.offsets_file:
        raise UsageError("pass --group GROUP (offsets in the consumer group) or --offsets-file PATH")
    if args.rejects and getattr(args, "opt_on_error", "fail") != "skip":
        raise UsageError("--rejects needs --on-error skip (under fail the first bad record stops the run)")
    if args.max_messages is not None and args.max_messages < 1:
        raise UsageError("--max-messages must be at least 1")


def _consumer_config(args, label: str) -> dict:
    """The consumer's settings for a reading run: offsets stored only by our commits, partition
    ends reported (idleness), where to start without a commit, librdkafka's log through Python's."""
    config = _kafka_config(args)
    config.update({"group.id": args.group or "dts-bridge", "enable.auto.commit": False,
                   "enable.auto.offset.store": False, "enable.partition.eof": True,
                   "auto.offset.reset": "earliest" if args.from_beginning else "latest",
                   "logger": observe.kafka_logger(verbose=args.verbose, prefix=f"{label}: ")})
    return config


def _mirror_reading(metrics: observe.Metrics, topic: str, tally: Tally, report) -> None:
    """Metrics of a reading run: the tally, Envelopes in, committed offsets and lag per partition."""
    metrics.count_tally(tally)
    metrics.count_to(metrics.envelopes_in, max(report.envelopes, tally.envelopes))
    for p, off in list(report.committed.items()):
        metrics.committed_offset.labels(topic=topic, partition=str(p)).set(off)
    for p, lag in report.lag().items():
        metrics.lag.labels(topic=topic, partition=str(p)).set(lag)


def _add_watch_flags(parser: argparse.ArgumentParser, kafka: bool) -> None:
    group = parser.add_argument_group("progress, status and metrics")
    group.add_argument("--no-progress", action="store_true",
                       help="no progress display (there is one only when stderr is a terminal)")
    group.add_argument("--status-interval", type=float, default=30.0, metavar="SECONDS",
                       help="write a one-line status to stderr every SECONDS (default: 30; 0: never)")
    group.add_argument("--metrics-port", type=int, metavar="PORT",
                       help="serve Prometheus metrics at http://HOST:PORT/metrics while the run lasts")
    group.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                       help="the address --metrics-port listens on (default: 127.0.0.1)")
    if kafka:
        group.add_argument("-v", "--verbose", action="count", default=0,
                           help="more of the Kafka client's log: -v INFO, -vv debug (default: warnings and errors, "
                                "each repeated message once a minute)")


@contextlib.contextmanager
def _watching(args, label: str, metrics: observe.Metrics, render: Callable,
              refresh: Callable[[observe.Metrics], None]):
    """The metrics server (--metrics-port) and the status line (--status-interval) of a run."""
    metrics.on_collect(lambda: refresh(metrics))
    if args.metrics_port is not None:
        try:
            metrics.serve(args.metrics_port, args.metrics_host)
        except OSError as err:
            raise UsageError(str(err)) from None
    status = observe.StatusLine(args.status_interval, label=label, render=render, before=metrics.refresh)
    try:
        with status:
            yield metrics
    finally:
        metrics.close()


def cmd_consume(args: argparse.Namespace) -> int:
    from bridge import kafka, pipeline
    _check_reading_args(args)
    side, framing = _consume_side(args)
    options = options_from(args, {"dts", side} | ({"pb"} if framing == "pb" else set()))
    check_output_dir(args.output, args.mkdir)
    files, sink, convert = _consume_output(args, side, framing, options)
    label = f"{PROG} consume {args.topic}"
    config = _consumer_config(args, label)
    log = config["logger"]
    ck = kafka.confluent()
    tally = Tally()
    report = Report()
    try:
        consumer = ck.Consumer(config)
    except ck.KafkaException as exc:
        raise UsageError(f"invalid Kafka settings: {exc.args[0]}") from None

    def refresh(metrics: observe.Metrics) -> None:
        _mirror_reading(metrics, args.topic, tally, report)

    def render(status: observe.StatusLine) -> str:
        lag = report.lag()
        parts = [f"{report.envelopes:,} Envelopes ({observe.rate_text(status.rate('in', report.envelopes))})",
                 f"{tally.outputs:,} records out ({observe.rate_text(status.rate('out', tally.outputs))})",
                 f"{tally.rejected:,} rejected"]
        if lag:
            parts.append("lag " + " ".join(f"{p}:{n:,}" for p, n in sorted(lag.items())))
        if report.committed:
            parts.append("committed " + " ".join(f"{p}:{o}" for p, o in sorted(report.committed.items())))
        return ", ".join(parts)

    bar = observe.progress(unit="Envelopes", enabled=False if args.no_progress else None, desc=label,
                           describe=lambda: f"{tally.outputs:,} out, {tally.rejected:,} rejected")
    try:
        rejects = files.get(args.rejects) if args.rejects else None
        # the ledger, like the rejects, is one of the run's files: cut back with them on a restart
        policy = ErrorPolicy(getattr(args, "opt_on_error", "fail"), tally=tally,
                             sink=rejects_sink(rejects, tally), keep_records=False,
                             ledger=ledger_sink(files.get(args.ledger) if args.ledger else None), name_entry=True)
        store = (kafka.FileOffsets(args.offsets_file, args.topic) if args.offsets_file
                 else kafka.GroupOffsets(consumer, args.topic))
        with _graceful_stop() as stop, _watching(args, label, observe.Metrics(), render, refresh):
            bar.follow(lambda: report.envelopes)
            try:
                pipeline.consume(consumer, args.topic, Overlay(store, lambda: files.offsets), convert, sink, policy,
                              partitions=args.partitions, start="earliest" if args.from_beginning else "latest",
                              max_messages=args.max_messages, idle_timeout=args.idle_timeout, stop=stop,
                              raw=side == "blob", report=report)
            except BaseException:
                with contextlib.suppress(Exception):
                    sink.flush()  # what was converted stays, uncommitted: the next run cuts it back
                raise
    finally:
        bar.close()
        files.close()
        consumer.close()
        observe.flush_repeats(log)
    reread = "unknown" if report.reread is None else report.reread
    committed = ", ".join(f"{p}:{o}" for p, o in sorted(report.committed.items())) or "nothing new"
    if args.json:
        doc = {"topic": args.topic, "input": tally.input, "converted": tally.converted, "rejected": tally.rejected,
               "not_emitted": tally.not_emitted, "outputs": tally.outputs,
               **{kind: getattr(tally, kind) for kind in SUBSTITUTIONS}, **report.as_dict()}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        sys.stdout.flush()
    print(f"{label}: {tally.summary()}; read {report.envelopes} Envelopes ({reread} read again after the last "
          f"commit, {report.held} held in unfinished Entries); committed {committed}; stopped: {report.stopped}",
          file=sys.stderr)
    return 1 if tally.rejected else 0


# ---- produce --------------------------------------------------------------------------------------

def cmd_produce(args: argparse.Namespace) -> int:
    from bridge.kafka import produce_file
    config = _kafka_config(args)
    log = config["logger"] = observe.kafka_logger(verbose=args.verbose, prefix=f"{PROG} produce: ")
    for path in args.inputs:
        if not os.path.isfile(path):
            raise UsageError(f"cannot read {path}: no such file")
    total = 0
    for path in args.inputs:
        count = produce_file(path, config, args.topic, args.partition, timeout=args.timeout)
        total += count
        where = f"partition {args.partition}" if args.partition is not None else "one partition (key = file name)"
        print(f"{PROG} produce {path}: sent {count} Envelope{'s' if count != 1 else ''} to {args.topic}, {where}", file=sys.stderr)
    observe.flush_repeats(log)
    return 0


# ---- the parsers ----------------------------------------------------------------------------------

def register(commands) -> None:
    """Add consume and produce to `dts-bridge`'s subcommands (called by bridge.cli.main)."""
    consume = commands.add_parser(
        "consume", formatter_class=_Formatter, help="convert DTS messages from a Kafka topic, committing offsets",
        description=_describe(
            "Read a DTS subscription topic, reassemble Envelopes per partition, convert and append to -o. Offsets are "
            "committed (to --group, or to --offsets-file) only after the output is fsynced, at every CHECKPOINT "
            "entry and at the end of the run, and never past the first segment of an unfinished Entries. Each "
            "commit records the output files' lengths in a state file next to them; a restart (after a crash "
            "too) cuts the files back to those lengths first, so nothing is written twice. The run "
            "ends after --max-messages, after --idle-timeout seconds without a message, or on SIGINT/SIGTERM. "
            "Partitions are assigned, not balanced: run one process per topic (or per --partitions set)."),
        epilog=_epilog(f"{PROG} consume --brokers dts.example:9092 --topic topic-subs-1 --group consumer-grp-1 "
                       f"--to blob -o out/p{{partition}}.jsonl --from-beginning",
                       f"{PROG} consume --brokers h:9092 --topic t --group g --sasl-username user -o "
                       f"'tuple/{{table}}.jsonl' --to tuple --on-error skip --rejects r.jsonl"))
    _add_kafka_flags(consume)
    _add_reading_flags(consume)
    consume.add_argument("--to", choices=("blob", "tuple", "dts", "dts-json"), help="output format (default: from -o)")
    consume.add_argument("-o", "--output", required=True, metavar="OUT",
                         help="output file, appended to; {partition} gives one file per partition, {table} one per "
                              "table (Tuple); its directory must exist (or pass --mkdir)")
    consume.add_argument("--mkdir", action="store_true", help="create the directory of -o if it is missing")
    consume.add_argument("--state", metavar="PATH",
                         help=f"the outputs' committed lengths (default: next to -o, named after it, ending "
                              f"{STATE_SUFFIX})")
    consume.add_argument("--table", metavar="DB.TABLE", help="Tuple output: only this table")
    consume.add_argument("--ledger", metavar="PATH", help=LEDGER_HELP + "; appended to, cut back on a restart "
                         "as the outputs are")
    consume.add_argument("--json", action="store_true", help="print the run's counts as one JSON document")
    _add_watch_flags(consume, kafka=True)
    add_option_flags(consume)
    consume.set_defaults(run=cmd_consume)

    produce = commands.add_parser(
        "produce", formatter_class=_Formatter, help="send .pb files' Envelopes to a Kafka topic",
        description=_describe(
            "Send each file's Envelopes, in order, to one partition of the topic (--partition, else the partition "
            "of the file's name as key). Each Envelope is acknowledged before the next is sent."),
        epilog=_epilog(f"{PROG} produce samples/mixed.pb --brokers 127.0.0.1:9092 --topic dts --partition 0"))
    produce.add_argument("inputs", nargs="+", metavar="FILE.pb", help=".pb files")
    _add_kafka_flags(produce)
    produce.add_argument("--partition", type=int, metavar="N", help="the partition (default: by file name)")
    produce.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                         help="how long to wait for each acknowledgement (default: 30)")
    produce.add_argument("-v", "--verbose", action="count", default=0,
                         help="more of the Kafka client's log: -v INFO, -vv debug (default: warnings and errors, "
                              "each repeated message once a minute)")
    produce.set_defaults(run=cmd_produce)
