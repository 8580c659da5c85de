"""`dts-bridge sync`: a DTS Kafka topic -> Blob or Tuple -> DataHub, in one process (docs/kafka.md).

Thin: the pipeline is bridge.sync (kafka.consume + DataHubWriter); this module reads flags, builds
the consumer, the writer and the sink, watches the run and prints its summary.
"""
from __future__ import annotations

import argparse
import contextlib
import sys

import orjson

from .cli import _describe, _epilog, _Formatter, add_option_flags, options_from, rejects_sink
from .cli_base import PROG, UsageError
from .cli_kafka import _add_kafka_flags, _add_watch_flags, _graceful_stop, _kafka_config, _watching
from .stream import ErrorPolicy, Tally

__all__ = ["register", "cmd_sync"]


def cmd_sync(args: argparse.Namespace) -> int:
    from . import kafka, observe, sync
    from .cli_tuple import tuple_converter
    from .datahub_sink import DataHubWriter, make_client
    if not args.group and not args.offsets_file:
        raise UsageError("pass --group GROUP (offsets in the consumer group) or --offsets-file PATH")
    if args.rejects and getattr(args, "opt_on_error", "fail") != "skip":
        raise UsageError("--rejects needs --on-error skip (under fail the first bad record stops the run)")
    if args.max_messages is not None and args.max_messages < 1:
        raise UsageError("--max-messages must be at least 1")
    if args.to == "tuple" and "{table}" not in args.datahub_topic:
        raise UsageError("--to tuple writes one topic per table: --datahub-topic needs {table} (e.g. '{db}_{table}')")
    options = options_from(args, {"dts", args.to})
    label = f"{PROG} sync {args.topic} -> {args.project}"
    metrics = observe.Metrics()
    client = make_client(args.datahub_endpoint, compress=args.compress)
    creating = None if args.no_create_topics else {"shards": args.shards, "lifecycle": args.lifecycle}
    writer = DataHubWriter(client, args.project, batch_records=args.batch_size, workers=args.workers,
                           max_retries=args.max_retries, create_topics=creating, observer=metrics.datahub_observer())
    config = _kafka_config(args)
    config.update({"group.id": args.group or "dts-bridge", "enable.auto.commit": False,
                   "enable.auto.offset.store": False, "enable.partition.eof": True,
                   "auto.offset.reset": "earliest" if args.from_beginning else "latest",
                   "logger": observe.kafka_logger(verbose=args.verbose, prefix=f"{label}: ")})
    ck = kafka.confluent()
    tally = Tally()
    report = kafka.ConsumeReport()
    try:
        consumer = ck.Consumer(config)
    except ck.KafkaException as exc:
        raise UsageError(f"invalid Kafka settings: {exc.args[0]}") from None
    rejects = open(args.rejects, "ab") if args.rejects else None
    seen = [0.0, 0.0]  # PutRecordsByShard count and seconds at the last status line

    def refresh(metrics: observe.Metrics) -> None:
        metrics.count_tally(tally)
        metrics.count_to(metrics.envelopes_in, report.envelopes)
        for p, off in list(report.committed.items()):
            metrics.committed_offset.labels(topic=args.topic, partition=str(p)).set(off)
        for p, lag in report.lag().items():
            metrics.lag.labels(topic=args.topic, partition=str(p)).set(lag)

    def render(status) -> str:
        count = metrics.value("datahub_request_seconds_count", request="PutRecordsByShard") or 0
        total = metrics.value("datahub_request_seconds_sum", request="PutRecordsByShard") or 0.0
        latency = (total - seen[1]) / (count - seen[0]) if count > seen[0] else None
        seen[:] = [count, total]
        lag = report.lag()
        parts = [f"{report.envelopes:,} Envelopes ({observe.rate_text(status.rate('in', report.envelopes))})",
                 f"{sink.written:,} records to DataHub ({observe.rate_text(status.rate('out', sink.written))})",
                 f"{tally.rejected:,} rejected", f"{writer.retries:,} DataHub retries ({writer.throttled:,} throttled)",
                 f"{writer.skipped:,} found already there"]
        if latency is not None:
            parts.append(f"latency {latency * 1000:.0f} ms")
        if lag:
            parts.append("lag " + " ".join(f"{p}:{n:,}" for p, n in sorted(lag.items())))
        return ", ".join(parts)

    try:
        policy = ErrorPolicy(getattr(args, "opt_on_error", "fail"), tally=tally,
                             sink=rejects_sink(rejects, tally), keep_records=False)
        if args.to == "blob":
            sink = sync.BlobSink(writer, args.datahub_topic, args.topic, policy)
            convert = sync.blob_converter(options)
        else:
            sink = sync.TupleSink(writer, args.datahub_topic, args.topic, policy)
            convert = tuple_converter(options, None)
        store = (kafka.FileOffsets(args.offsets_file, args.topic) if args.offsets_file
                 else kafka.GroupOffsets(consumer, args.topic))
        bar = observe.progress(unit="records", enabled=False if args.no_progress else None, desc=label,
                               describe=lambda: f"{tally.rejected:,} rejected, {writer.retries:,} retries")
        with contextlib.closing(bar), _graceful_stop() as stop, _watching(args, label, metrics, render, refresh):
            bar.follow(lambda: sink.written)
            report = sync.run(consumer, args.topic, store, writer, sink, convert, policy,
                              partitions=args.partitions, start="earliest" if args.from_beginning else "latest",
                              max_messages=args.max_messages, idle_timeout=args.idle_timeout, stop=stop,
                              raw=args.to == "blob", commit_interval=args.commit_interval or None, report=report)
    finally:
        with contextlib.suppress(Exception):
            consumer.close()
        if rejects is not None:
            rejects.close()
    committed = ", ".join(f"{p}:{o}" for p, o in sorted(report.committed.items())) or "nothing new"
    if args.json:
        doc = {"topic": args.topic, "input": tally.input, "converted": tally.converted, "rejected": tally.rejected,
               "not_emitted": tally.not_emitted, "outputs": tally.outputs, "redelivered": tally.redelivered,
               "written": sink.written, "already_landed": writer.skipped, "datahub_requests": writer.requests,
               "datahub_retries": writer.retries, **report.as_dict()}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        sys.stdout.flush()
    print(f"{label}: {tally.summary()}; {sink.written} records written to DataHub ({writer.skipped} found already "
          f"there), {writer.requests} requests, {writer.retries} retries; read {report.envelopes} Envelopes "
          f"({report.held} held in unfinished Entries); committed {committed}; stopped: {report.stopped}",
          file=sys.stderr)
    return 1 if tally.rejected else 0


def register(commands) -> None:
    """Add sync to `dts-bridge`'s subcommands (called by bridge.cli)."""
    parser = commands.add_parser(
        "sync", formatter_class=_Formatter, help="Kafka DTS topic -> DataHub, continuously, exactly once in effect",
        description=_describe(
            "Read a DTS subscription topic, convert to Blob (one DataHub topic) or Tuple (one topic per table, from "
            "a {db}/{table} template) and write to DataHub in order per shard. Kafka offsets are committed only "
            "after DataHub acknowledged every record before them (at every CHECKPOINT entry and at the end). After "
            "a crash the run resumes at the last commit, and records that already landed are recognised by their "
            "position attributes and not written again. SIGINT/SIGTERM drain, commit and exit 0. Credentials: "
            "$DATAHUB_ACCESS_ID, $DATAHUB_ACCESS_KEY."),
        epilog=_epilog(f"{PROG} sync --brokers dts.example:9092 --topic topic-subs-1 --group grp-1 --to blob "
                       "--datahub-endpoint https://dh-cn-hangzhou.aliyuncs.com --project dts --datahub-topic orders_blob",
                       f"{PROG} sync --brokers h:9092 --topic t --group g --to tuple --datahub-endpoint URL "
                       "--project dts --datahub-topic '{db}_{table}' --from-beginning"))
    _add_kafka_flags(parser)
    parser.add_argument("--group", metavar="GROUP", help="consumer group: its committed offsets are where a run starts")
    parser.add_argument("--offsets-file", metavar="PATH", help="keep offsets in this local JSON file instead")
    parser.add_argument("--partitions", type=lambda s: [int(p) for p in s.split(",")], metavar="P[,P...]",
                        help="read only these partitions (default: all)")
    parser.add_argument("--from-beginning", action="store_true",
                        help="with no committed offset, start at the earliest message (default: the latest)")
    parser.add_argument("--to", choices=("blob", "tuple"), default="blob", help="DataHub record type (default: blob)")
    parser.add_argument("--datahub-endpoint", required=True, metavar="URL", help="DataHub endpoint")
    parser.add_argument("--project", required=True, help="DataHub project")
    parser.add_argument("--datahub-topic", required=True, metavar="NAME",
                        help="Blob: the topic; Tuple: a template with {db} and {table}, e.g. '{db}_{table}'")
    parser.add_argument("--no-create-topics", action="store_true", help="a missing DataHub topic is an error")
    parser.add_argument("--shards", type=int, default=1, metavar="N", help="shards of a created topic (default: 1)")
    parser.add_argument("--lifecycle", type=int, default=7, metavar="DAYS", help="lifecycle of a created topic")
    parser.add_argument("--batch-size", type=int, default=1000, metavar="N", help="records per request at most")
    parser.add_argument("--workers", type=int, default=4, metavar="N", help="shards written in parallel (default: 4)")
    parser.add_argument("--max-retries", type=int, default=12, metavar="N",
                        help="retries of a transient DataHub failure, with jittered backoff up to 10 s (default: 12)")
    parser.add_argument("--compress", choices=("lz4", "deflate", "zlib", "none"), default="lz4",
                        help="request body compression (default: lz4)")
    parser.add_argument("--commit-interval", type=float, default=5.0, metavar="SECONDS",
                        help="also commit (after DataHub acknowledged everything) this often, besides every "
                             "CHECKPOINT entry (0: only at checkpoints and the end; default: 5)")
    parser.add_argument("--max-messages", type=int, metavar="N", help="stop after N Envelopes")
    parser.add_argument("--idle-timeout", type=float, metavar="SECONDS",
                        help="stop once every partition is read to its end and no message came for this long")
    parser.add_argument("--rejects", metavar="PATH", help="with --on-error skip: append one JSON line per rejected record")
    _add_watch_flags(parser, kafka=True)
    parser.add_argument("--json", action="store_true", help="print the run's counts as one JSON document")
    add_option_flags(parser)
    parser.set_defaults(run=cmd_sync)
