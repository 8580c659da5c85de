"""The pipeline ends of `dts-bridge`: `consume` (Kafka -> files), `produce` (.pb -> Kafka) and
`deliver` (Blob / Tuple JSON Lines -> DataHub). Thin, like bridge.cli: the work is in
bridge.kafka and bridge.datahub_sink, the error policy and the accounting in bridge.stream.

`consume` appends to its output (a run continues where the last commit left it) and makes it
durable before every offset commit; see docs/kafka.md for the commit rule.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from typing import Any

import orjson
from google.protobuf import json_format

from ._wire import entry_to_json_line, pack_entries, write_pb
from .blob_encode import BlobEncoder, shard_key
from .cli import _describe, _epilog, _Formatter, add_option_flags, options_from, rejects_sink, resolve_format
from .cli_base import PROG, UsageError, _numbered_lines, _one_line
from .cli_tuple import SCHEMA_SUFFIX, _tuple_module, _versioned, schema_path, tuple_converter
from .errors import BridgeError, DecodeError
from .options import Options
from .stream import ErrorPolicy, Tally

__all__ = ["register", "cmd_consume", "cmd_produce", "cmd_deliver"]

PARTITION_PLACEHOLDER = "{partition}"
TABLE_PLACEHOLDER = "{table}"


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
    from .kafka import SASL_PASSWORD_ENV, SASL_USERNAME_ENV, client_config
    extra = {}
    for item in args.kafka_config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"-X takes KEY=VALUE, not {item!r}")
        extra[key.strip()] = value
    return client_config(args.brokers, security_protocol=args.security_protocol, sasl_mechanism=args.sasl_mechanism,
                         sasl_username=args.sasl_username or os.environ.get(SASL_USERNAME_ENV),
                         sasl_password=args.sasl_password or os.environ.get(SASL_PASSWORD_ENV), extra=extra)


# ---- consume: durable appending outputs --------------------------------------------------------

class _AppendFiles:
    """Output files opened for appending, named from a template with {partition} / {table};
    `sync()` flushes and fsyncs every one (and the rejects file) before an offset commit."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.files: dict[str, Any] = {}
        self.extra: list = []

    def path(self, partition=None, table=None) -> str:
        path = self.template.replace(PARTITION_PLACEHOLDER, str(partition))
        return path.replace(TABLE_PLACEHOLDER, str(table))

    def get(self, path: str):
        fh = self.files.get(path)
        if fh is None:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                fh = self.files[path] = open(path, "ab")
            except OSError as err:
                raise UsageError(f"cannot write {path}: {err.strerror}") from None
        return fh

    def sync(self) -> None:
        for fh in [*self.files.values(), *self.extra]:
            fh.flush()
            os.fsync(fh.fileno())

    def close(self) -> None:
        for fh in [*self.files.values(), *self.extra]:
            fh.close()


class _BlobOut:
    def __init__(self, files: _AppendFiles) -> None:
        self.files = files

    def write(self, where: dict, line: bytes) -> None:
        self.files.get(self.files.path(where["partition"])).write(line + b"\n")

    def sync(self) -> None:
        self.files.sync()


class _DtsOut:
    """dts-json: one Entry per line; .pb: the Entries since the last sync packed into Envelopes."""

    def __init__(self, files: _AppendFiles, framing: str, options: Options) -> None:
        self.files, self.framing, self.options = files, framing, options
        self.pending: dict[str, list] = {}

    def write(self, where: dict, entry) -> None:
        path = self.files.path(where["partition"])
        if self.framing == "json":
            self.files.get(path).write(entry_to_json_line(entry))
        else:
            self.pending.setdefault(path, []).append(entry)

    def sync(self) -> None:
        for path, entries in self.pending.items():
            write_pb(self.files.get(path), pack_entries(entries, self.options.max_message_bytes))
        self.pending.clear()
        self.files.sync()


class _TupleOut:
    """Tuple JSON Lines, one file per table ({table} in -o) with NAME.schema.json next to it; a
    new RecordSchema continues in NAME.v2.jsonl, ... as `convert` does, across runs too."""

    def __init__(self, files: _AppendFiles, options: Options) -> None:
        self.files, self.options, self.tup = files, options, _tuple_module()
        self.current: dict[str, tuple[int, str, dict]] = {}  # base path -> (version, path, schema)

    def write(self, where: dict, item) -> None:
        table, columns, schema, row = item
        base = self.files.path(where["partition"], table)
        current = self.current.get(base)
        if current is None or current[2] != schema:
            version = self._version(base, table, columns, schema, 1 if current is None else current[0] + 1)
            current = self.current[base] = (version, _versioned(base, "jsonl", version), schema)
        self.tup.write_tuple_jsonl([row], self.files.get(current[1]))

    def _version(self, base: str, table: str, columns, schema: dict, version: int) -> int:
        """The first version from `version` on whose RecordSchema is this one, else a new one."""
        while True:
            side_path = schema_path(_versioned(base, "jsonl", version), "jsonl")
            if not os.path.exists(side_path):
                break
            with open(side_path, "rb") as fh:
                if orjson.loads(fh.read()).get("fields") == schema["fields"]:
                    return version
            version += 1
        side = {"table": table, **schema}
        if self.options.lossless:
            side["dtsColumns"] = [json_format.MessageToDict(c) for c in columns]
        os.makedirs(os.path.dirname(os.path.abspath(side_path)), exist_ok=True)
        with open(side_path, "wb") as fh:
            fh.write(orjson.dumps(side, option=orjson.OPT_INDENT_2) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        return version

    def sync(self) -> None:
        self.files.sync()


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
    files = _AppendFiles(args.output)
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


def cmd_consume(args: argparse.Namespace) -> int:
    from . import kafka
    if not args.group and not args.offsets_file:
        raise UsageError("pass --group GROUP (offsets in the consumer group) or --offsets-file PATH")
    if args.rejects and getattr(args, "opt_on_error", "fail") != "skip":
        raise UsageError("--rejects needs --on-error skip (under fail the first bad record stops the run)")
    if args.max_messages is not None and args.max_messages < 1:
        raise UsageError("--max-messages must be at least 1")
    side, framing = _consume_side(args)
    options = options_from(args, {"dts", side} | ({"pb"} if framing == "pb" else set()))
    files, sink, convert = _consume_output(args, side, framing, options)
    config = _kafka_config(args)
    config.update({"group.id": args.group or "dts-bridge", "enable.auto.commit": False,
                   "enable.auto.offset.store": False, "enable.partition.eof": True,
                   "auto.offset.reset": "earliest" if args.from_beginning else "latest"})
    ck = kafka.confluent()
    tally = Tally()
    label = f"{PROG} consume {args.topic}"
    try:
        consumer = ck.Consumer(config)
    except ck.KafkaException as exc:
        raise UsageError(f"invalid Kafka settings: {exc.args[0]}") from None
    try:
        rejects = None
        if args.rejects:
            rejects = files.get(args.rejects)
            files.files.pop(args.rejects)
            files.extra.append(rejects)
        policy = ErrorPolicy(getattr(args, "opt_on_error", "fail"), tally=tally,
                             sink=rejects_sink(rejects, tally), keep_records=False)
        store = (kafka.FileOffsets(args.offsets_file, args.topic) if args.offsets_file
                 else kafka.GroupOffsets(consumer, args.topic))
        with _graceful_stop() as stop:
            try:
                report = kafka.consume(consumer, args.topic, store, convert, sink, policy,
                                       partitions=args.partitions, start="earliest" if args.from_beginning else "latest",
                                       max_messages=args.max_messages, idle_timeout=args.idle_timeout, stop=stop,
                                       raw=side == "blob")
            except BaseException:
                with contextlib.suppress(Exception):
                    sink.sync()  # at-least-once: what was converted stays, uncommitted
                raise
    finally:
        files.close()
        consumer.close()
    reread = "unknown" if report.reread is None else report.reread
    committed = ", ".join(f"{p}:{o}" for p, o in sorted(report.committed.items())) or "nothing new"
    if args.json:
        doc = {"topic": args.topic, "input": tally.input, "converted": tally.converted, "rejected": tally.rejected,
               "not_emitted": tally.not_emitted, "outputs": tally.outputs, **report.as_dict()}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        sys.stdout.flush()
    print(f"{label}: {tally.summary()}; read {report.envelopes} Envelopes ({reread} read again after the last "
          f"commit, {report.held} held in unfinished Entries); committed {committed}; stopped: {report.stopped}",
          file=sys.stderr)
    return 1 if tally.rejected else 0


# ---- produce --------------------------------------------------------------------------------------

def cmd_produce(args: argparse.Namespace) -> int:
    from .kafka import produce_file
    config = _kafka_config(args)
    for path in args.inputs:
        if not os.path.isfile(path):
            raise UsageError(f"cannot read {path}: no such file")
    total = 0
    for path in args.inputs:
        count = produce_file(path, config, args.topic, args.partition, timeout=args.timeout)
        total += count
        where = f"partition {args.partition}" if args.partition is not None else "one partition (key = file name)"
        print(f"{PROG} produce {path}: sent {count} Envelope{'s' if count != 1 else ''} to {args.topic}, {where}", file=sys.stderr)
    return 0


# ---- deliver --------------------------------------------------------------------------------------

def _tuple_source(args, tup):
    side_path = args.schema or schema_path(args.input, "jsonl")
    try:
        with open(side_path, "rb") as fh:
            side = orjson.loads(fh.read())
        fields = side["fields"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError) as err:
        raise UsageError(f"Tuple input needs its RecordSchema ({side_path}, or --schema): {_one_line(err)}") from None
    keys = [c["name"] for c in side.get("dtsColumns", []) if c.get("isKey")]
    table = args.table or side.get("table") or ""
    return {"fields": fields}, keys, table


def cmd_deliver(args: argparse.Namespace) -> int:
    from .datahub_sink import DataHubError, DataHubSink, tuple_shard_key
    side, framing = resolve_format(args.input, args.from_, "--from")
    if side not in ("blob", "tuple") or framing != "jsonl":
        raise UsageError("deliver reads Blob JSON Lines, or Tuple JSON Lines with --from tuple")
    if args.rejects and args.on_error != "skip":
        raise UsageError("--rejects needs --on-error skip (under fail the first bad record stops the run)")
    tally = Tally()
    label = f"{PROG} deliver {args.input}"
    with contextlib.ExitStack() as stack:
        try:
            fh = stack.enter_context(open(args.input, "rb"))
        except OSError as err:
            raise UsageError(f"cannot read {args.input}: {err.strerror}") from None
        rejects = stack.enter_context(open(args.rejects, "wb")) if args.rejects else None
        policy = ErrorPolicy(args.on_error, tally=tally, sink=rejects_sink(rejects, tally), keep_records=False)
        schema = keys = table = None
        if side == "tuple":
            tup = _tuple_module()
            schema, keys, table = _tuple_source(args, tup)
            fields = [(f["name"], f["type"]) for f in tup.load_record_schema(schema)["fields"]]
        sink = DataHubSink(args.datahub_endpoint, args.project, args.topic, record_schema=schema,
                           batch_size=args.batch_size, max_retries=args.max_retries, routing=args.routing,
                           compress=args.compress)
        for number, line in _numbered_lines(fh):
            tally.input += 1
            try:
                if side == "blob":
                    try:
                        msg = orjson.loads(line)
                    except orjson.JSONDecodeError as err:
                        raise DecodeError(f"invalid JSON ({err.msg})", value=line, line=number) from None
                    sink.put_blob(line.rstrip(b"\r\n"), shard_key(msg))
                else:
                    try:
                        row = tup.coerce_row(orjson.loads(line), fields, line=number)
                    except orjson.JSONDecodeError as err:
                        raise DecodeError(f"invalid JSON ({err.msg})", value=line, line=number) from None
                    sink.put_tuple(row, tuple_shard_key(row, table, keys))
            except DataHubError:
                raise  # the service, not this record: no later record would fare better
            except BridgeError as err:
                policy.reject(err.located(line=number, source=args.input), line)
                continue
            tally.converted += 1
            tally.outputs += 1
        sink.close()
    print(f"{label}: delivered {tally.converted} of {tally.input} records to {args.project}/{args.topic} "
          f"in {sink.requests} requests ({sink.retries} retries); rejected {tally.rejected}", file=sys.stderr)
    return 1 if tally.rejected else 0


# ---- the parsers ----------------------------------------------------------------------------------

def register(commands) -> None:
    """Add consume, produce and deliver to `dts-bridge`'s subcommands (called by bridge.cli)."""
    consume = commands.add_parser(
        "consume", formatter_class=_Formatter, help="convert DTS messages from a Kafka topic, committing offsets",
        description=_describe(
            "Read a DTS subscription topic, reassemble Envelopes per partition, convert and append to -o. Offsets are "
            "committed (to --group, or to --offsets-file) only after the output is fsynced, at every CHECKPOINT "
            "entry and at the end of the run, and never past the first segment of an unfinished Entries. The run "
            "ends after --max-messages, after --idle-timeout seconds without a message, or on SIGINT/SIGTERM. "
            "Partitions are assigned, not balanced: run one process per topic (or per --partitions set)."),
        epilog=_epilog(f"{PROG} consume --brokers dts.example:9092 --topic topic-subs-1 --group consumer-grp-1 "
                       f"--to blob -o out/p{{partition}}.jsonl --from-beginning",
                       f"{PROG} consume --brokers h:9092 --topic t --group g --sasl-username user -o "
                       f"'tuple/{{table}}.jsonl' --to tuple --on-error skip --rejects r.jsonl"))
    _add_kafka_flags(consume)
    consume.add_argument("--group", metavar="GROUP", help="consumer group: its committed offsets are where a run starts")
    consume.add_argument("--offsets-file", metavar="PATH",
                         help="keep offsets in this local JSON file instead of the group (brokers without group commits)")
    consume.add_argument("--partitions", type=lambda s: [int(p) for p in s.split(",")], metavar="P[,P...]",
                         help="read only these partitions (default: all)")
    consume.add_argument("--to", choices=("blob", "tuple", "dts", "dts-json"), help="output format (default: from -o)")
    consume.add_argument("-o", "--output", required=True, metavar="OUT",
                         help="output file, appended to; {partition} gives one file per partition, {table} one per "
                              "table (Tuple)")
    consume.add_argument("--table", metavar="DB.TABLE", help="Tuple output: only this table")
    consume.add_argument("--from-beginning", action="store_true",
                         help="with no committed offset, start at the earliest message (default: the latest)")
    consume.add_argument("--max-messages", type=int, metavar="N", help="stop after N Envelopes")
    consume.add_argument("--idle-timeout", type=float, metavar="SECONDS",
                         help="stop once every partition is read to its end and no message came for this long "
                              "(default: run until stopped)")
    consume.add_argument("--rejects", metavar="PATH", help="with --on-error skip: append one JSON line per rejected record")
    consume.add_argument("--json", action="store_true", help="print the run's counts as one JSON document")
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
    produce.set_defaults(run=cmd_produce)

    deliver = commands.add_parser(
        "deliver", formatter_class=_Formatter, help="write Blob or Tuple JSON Lines to a DataHub topic",
        description=_describe(
            "Write a Blob JSON Lines file as BlobRecords, or a Tuple JSON Lines file (--from tuple, with its "
            f"NAME{SCHEMA_SUFFIX}) as TupleRecords, with PutRecords in batches. Records go to shards by the "
            "DataWorks rule (primary-key values, else the table name, hashed over the ACTIVE shards); transient "
            "failures are retried with exponential backoff. Credentials: $DATAHUB_ACCESS_ID, $DATAHUB_ACCESS_KEY."),
        epilog=_epilog(f"{PROG} deliver mixed.jsonl --datahub-endpoint https://dh-cn-hangzhou.aliyuncs.com "
                       "--project dts --topic mixed_blob",
                       f"{PROG} deliver tuple/shop.orders.jsonl --from tuple --datahub-endpoint URL --project dts "
                       "--topic shop_orders"))
    deliver.add_argument("input", metavar="FILE.jsonl", help="Blob or Tuple JSON Lines")
    deliver.add_argument("--from", dest="from_", choices=("blob", "tuple"), help="input format (default: blob)")
    deliver.add_argument("--datahub-endpoint", required=True, metavar="URL", help="DataHub endpoint")
    deliver.add_argument("--project", required=True, help="DataHub project")
    deliver.add_argument("--topic", required=True, help="DataHub topic (Blob, or Tuple with the file's RecordSchema)")
    deliver.add_argument("--schema", metavar="PATH", help=f"Tuple input: its RecordSchema (default: NAME{SCHEMA_SUFFIX})")
    deliver.add_argument("--table", metavar="DB.TABLE", help="Tuple input: the table (routing key without keys)")
    deliver.add_argument("--batch-size", type=int, default=500, metavar="N", help="records per PutRecords (default: 500)")
    deliver.add_argument("--max-retries", type=int, default=6, metavar="N",
                         help="retries of a transient failure, backing off 0.2 s, 0.4 s, ... up to 10 s (default: 6)")
    deliver.add_argument("--routing", choices=("shard", "partition-key"), default="shard",
                         help="shard: hash the key over the shard ids here; partition-key: let DataHub hash it")
    deliver.add_argument("--compress", choices=("lz4", "deflate", "zlib", "none"), default="lz4",
                         help="request body compression (default: lz4)")
    deliver.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                         help="a record DataHub or the RecordSchema refuses: stop (exit 1) or skip and count it")
    deliver.add_argument("--rejects", metavar="PATH", help="with --on-error skip: one JSON line per rejected record")
    deliver.set_defaults(run=cmd_deliver)
