"""`dts-bridge sync`: a DTS Kafka topic -> Blob or Tuple -> DataHub, in one process (docs/kafka.md).

Thin: the pipeline is bridge.sync (the pipeline loop + DataHubWriter); this module reads flags, builds
the consumer, the writer and the sink, watches the run and prints its summary.
"""
from __future__ import annotations

import argparse
import contextlib
import sys

import orjson

from bridge.cli.base import (
    LEDGER_HELP,
    PROG,
    UsageError,
    _describe,
    _epilog,
    _Formatter,
    add_option_flags,
    ledger_sink,
    options_from,
    rejects_sink,
)
from bridge.cli.kafka import (
    _add_kafka_flags,
    _add_reading_flags,
    _add_watch_flags,
    _check_reading_args,
    _consumer_config,
    _graceful_stop,
    _mirror_reading,
    _watching,
)
from bridge.stream import ErrorPolicy, Tally
from bridge.stream.pipeline import Report

__all__ = ["register", "cmd_sync", "cmd_replay"]


def _check_routing_flags(args) -> None:
    """Flag combinations that make no sense, refused before anything starts."""
    dlq = getattr(args, "on_table_error", None) in ("dlq", "halt-table") or getattr(args, "oversized", "fail") == "dlq"
    if dlq and not getattr(args, "dead_letters", None):
        raise UsageError("--on-table-error dlq|halt-table and --oversized dlq write dead letters: pass --dead-letters PATH")
    if args.to == "tuple" and "{table}" not in args.datahub_topic:
        raise UsageError("--to tuple writes one topic per table: --datahub-topic needs {table} (e.g. '{db}_{table}')")
    if args.to == "blob" and "{table}" in args.datahub_topic:
        raise UsageError("--to blob writes one topic, or one per database ({db}): --datahub-topic takes no {table}")
    if args.to == "blob" and args.schema_change not in (None, "evolve"):
        raise UsageError("--schema-change is for --to tuple (Blob topics carry DDL messages as they come)")


def _sinks(args, writer, policy, source: str, options, letters):
    """(sink, gate) for --to blob|tuple with routing, the table-error policy and dead letters."""
    from bridge import sync
    return sync.make_sink(args.to, writer, args.datahub_topic, source, policy, options,
                          include=getattr(args, "include", None), exclude=getattr(args, "exclude", None),
                          on_table_error=args.on_table_error, schema_change=args.schema_change,
                          oversized=args.oversized, letters=letters)


def cmd_sync(args: argparse.Namespace) -> int:
    from bridge import kafka, sync
    from bridge.cli import observe
    from bridge.datahub.sink import DataHubWriter, make_client
    _check_reading_args(args)
    _check_routing_flags(args)
    from bridge.deadletters import DeadLetters
    options = options_from(args, {"dts", args.to})
    label = f"{PROG} sync {args.topic} -> {args.project}"
    metrics = observe.Metrics()
    client = make_client(args.datahub_endpoint, compress=args.compress)
    creating = None if args.no_create_topics else {"shards": args.shards, "lifecycle": args.lifecycle}
    if args.max_buffered < 1:
        raise UsageError("--max-buffered must be at least 1")
    writer = DataHubWriter(client, args.project, batch_records=args.batch_size, workers=args.workers,
                           max_retries=args.max_retries, create_topics=creating, observer=metrics.datahub_observer(),
                           max_buffered=args.max_buffered)
    config = _consumer_config(args, label)
    # while the writer's bounded buffer blocks the loop, librdkafka prefetches at most this much
    config.setdefault("queued.max.messages.kbytes", 16384)
    ck = kafka.confluent()
    tally = Tally()
    report = Report()
    try:
        consumer = ck.Consumer(config)
    except ck.KafkaException as exc:
        raise UsageError(f"invalid Kafka settings: {exc.args[0]}") from None
    rejects = open(args.rejects, "ab") if args.rejects else None
    ledger = open(args.ledger, "ab") if args.ledger else None
    letters = None
    if args.dead_letters:
        letters = DeadLetters(args.dead_letters, {
            "topic": args.topic, "store": f"group {args.group}" if not args.offsets_file else f"file {args.offsets_file}",
            "read_partitions": args.partitions})
        letters.restore()
    seen = [0.0, 0.0]  # PutRecordsByShard count and seconds at the last status line

    def refresh(metrics: observe.Metrics) -> None:
        _mirror_reading(metrics, args.topic, tally, report)

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
                             sink=rejects_sink(rejects, tally), keep_records=False, ledger=ledger_sink(ledger))
        sink, convert = _sinks(args, writer, policy, args.topic, options, letters)
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
    except sync.TopicNameCollision as err:
        raise UsageError(str(err)) from None
    finally:
        if letters is not None:
            letters.close()
        with contextlib.suppress(Exception):
            consumer.close()
        if rejects is not None:
            rejects.close()
        if ledger is not None:
            ledger.close()
    committed = ", ".join(f"{p}:{o}" for p, o in sorted(report.committed.items())) or "nothing new"
    if args.json:
        doc = {"topic": args.topic, "input": tally.input, "converted": tally.converted, "rejected": tally.rejected,
               "not_emitted": tally.not_emitted, "outputs": tally.outputs, "redelivered": tally.redelivered,
               "zero_dates": tally.zero_dates, "out_of_range": tally.out_of_range, "fractions": tally.fractions,
               "written": sink.written, "already_landed": writer.skipped, "datahub_requests": writer.requests,
               "datahub_retries": writer.retries, "dead_letters": letters.written if letters else 0,
               "refused_by_datahub": writer.refused, "halted_tables": dict(sink.tables.halted) if sink.tables else {},
               "schema_ignored": dict(getattr(sink, "ignored", {})),
               "evolved": [{"topic": t, "fields": f} for t, f, _ in getattr(sink, "evolved", [])],
               **report.as_dict()}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        sys.stdout.flush()
    print(f"{label}: {tally.summary()}; {sink.written} records written to DataHub ({writer.skipped} found already "
          f"there), {writer.requests} requests, {writer.retries} retries; read {report.envelopes} Envelopes "
          f"({report.held} held in unfinished Entries); committed {committed}; stopped: {report.stopped}"
          + (f"; {letters.written} dead letters to {args.dead_letters}" if letters else "")
          + (f"; halted tables: {', '.join(sorted(sink.tables.halted))}" if sink.tables and sink.tables.halted else "")
          + "".join(f"; {t}: {c['values']} values of {c['rows']} rows left out ({', '.join(c['fields'])}: "
                    f"--schema-change ignore)" for t, c in sorted(getattr(sink, "ignored", {}).items())),
          file=sys.stderr)
    return 1 if tally.rejected else 0


def _add_delivery_flags(parser) -> None:
    parser.add_argument("--schema-change", choices=("evolve", "lenient", "ignore", "fail"), default=None,
                        help="Tuple: a row whose columns differ from its topic's (DDL). evolve (default): new or renamed "
                             "columns appended as nullable fields, dropped ones NULL, a changed type the Entry's "
                             "error; lenient: a changed type goes to a STRING field <column>__<newtype>; ignore: "
                             "the topic is never altered, values it has no field for are left out and counted; "
                             "fail: stop, naming the table, fields and position")
    parser.add_argument("--dead-letters", metavar="PATH",
                        help="JSON Lines of Entries and records not delivered (the Entry's bytes, position, table, "
                             "error, topic); fsynced before every commit, cut back to the commit on restart")
    parser.add_argument("--on-table-error", choices=("dlq", "halt-table", "halt-all"), default=None,
                        help="an Entry of a table that cannot be converted or written, or a record DataHub refuses "
                             "as malformed: dlq (dead letter, go on), halt-table (dead letter it and every later "
                             "record of its table), halt-all (stop). Default: as --on-error")
    parser.add_argument("--oversized", choices=("fail", "dlq"), default="fail",
                        help="a record over DataHub's limits (4 MB a request, 2 MB a STRING): stop (default) or "
                             "dead letter its Entry")


def cmd_replay(args: argparse.Namespace) -> int:
    from bridge import sync
    from bridge.datahub.sink import DataHubWriter, make_client
    from bridge.deadletters import read_dead_letters
    args.include = args.exclude = None
    args.on_table_error, args.oversized = None, "fail"
    _check_routing_flags(args)
    args.oversized = "policy"  # a letter still oversized is rejected under --on-error, like any other
    letters = read_dead_letters(args.from_dlq)
    options = options_from(args, {"dts", args.to})
    tally = Tally()
    rejects = open(args.rejects, "ab") if args.rejects else None
    policy = ErrorPolicy(getattr(args, "opt_on_error", "fail"), tally=tally, sink=rejects_sink(rejects, tally),
                         keep_records=False)
    creating = None if args.no_create_topics else {"shards": args.shards, "lifecycle": args.lifecycle}
    writer = DataHubWriter(make_client(args.datahub_endpoint, compress=args.compress), args.project,
                           batch_records=args.batch_size, max_retries=args.max_retries, create_topics=creating)
    source = (letters[0]["source"] if letters else "") + sync.REPLAY_SUFFIX
    try:
        sink, gate = _sinks(args, writer, policy, source, options, None)
        done = sync.replay(letters, writer, sink, gate)
    except sync.TopicNameCollision as err:
        raise UsageError(str(err)) from None
    finally:
        writer.stop()
        if rejects is not None:
            rejects.close()
    if args.json:
        doc = {"input": tally.input, "converted": tally.converted, "rejected": tally.rejected,
               "not_emitted": tally.not_emitted, "outputs": tally.outputs, **done}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    print(f"{PROG} replay {args.from_dlq}: {len(letters)} dead letters; {tally.summary()}; {done['written']} records "
          f"written to DataHub ({done['already_landed']} found already there)", file=sys.stderr)
    return 1 if tally.rejected else 0


def _add_datahub_flags(parser, topic_help: str) -> None:
    """Where and how records go to DataHub (sync and replay)."""
    parser.add_argument("--to", choices=("blob", "tuple"), default="blob", help="DataHub record type (default: blob)")
    parser.add_argument("--datahub-endpoint", required=True, metavar="URL", help="DataHub endpoint")
    parser.add_argument("--project", required=True, help="DataHub project")
    parser.add_argument("--datahub-topic", required=True, metavar="NAME", help=topic_help)
    parser.add_argument("--no-create-topics", action="store_true", help="a missing DataHub topic is an error")
    parser.add_argument("--shards", type=int, default=1, metavar="N", help="shards of a created topic (default: 1)")
    parser.add_argument("--lifecycle", type=int, default=7, metavar="DAYS", help="lifecycle of a created topic")
    parser.add_argument("--batch-size", type=int, default=1000, metavar="N", help="records per request at most")
    parser.add_argument("--max-retries", type=int, default=12, metavar="N",
                        help="retries of a transient DataHub failure, with jittered backoff up to 10 s (default: 12)")
    parser.add_argument("--compress", choices=("lz4", "deflate", "zlib", "none"), default="lz4",
                        help="request body compression (default: lz4)")


def register(commands) -> None:
    """Add sync and replay to `dts-bridge`'s subcommands (called by bridge.cli.main)."""
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
    _add_reading_flags(parser)
    _add_datahub_flags(parser, "Blob: the topic (or one per database with {db}); Tuple: a template with {db} and "
                               "{table}, e.g. '{db}_{table}'")
    parser.add_argument("--workers", type=int, default=4, metavar="N", help="shards written in parallel (default: 4)")
    parser.add_argument("--max-buffered", type=int, default=20_000, metavar="N",
                        help="records waiting for DataHub at most; beyond that the Kafka loop waits (default: 20000)")
    parser.add_argument("--commit-interval", type=float, default=5.0, metavar="SECONDS",
                        help="also commit (after DataHub acknowledged everything) this often, besides every "
                             "CHECKPOINT entry (0: only at checkpoints and the end; default: 5)")
    parser.add_argument("--include", action="append", metavar="PATTERN",
                        help="only tables whose db.table matches this shell pattern (repeatable; e.g. 'shop.*')")
    parser.add_argument("--exclude", action="append", metavar="PATTERN",
                        help="leave out tables whose db.table matches (repeatable; counted as not emitted)")
    _add_delivery_flags(parser)
    _add_watch_flags(parser, kafka=True)
    parser.add_argument("--ledger", metavar="PATH", help=LEDGER_HELP + "; appended to (a restart after a crash "
                        "may write again the lines of records it reads again, as --rejects)")
    parser.add_argument("--json", action="store_true", help="print the run's counts as one JSON document")
    add_option_flags(parser)
    parser.set_defaults(run=cmd_sync)

    replay = commands.add_parser(
        "replay", formatter_class=_Formatter, help="send the dead letters of sync to DataHub again, after a fix",
        description=_describe(
            "Read a dead-letter file of sync (--dead-letters), convert each Entry again with the given options and "
            "write it (a letter of one refused record: that record only) to the topics sync would have used. "
            "Idempotent: the records carry their position and '<Kafka topic>#dead-letters' as attributes, and a "
            "rerun skips what an earlier replay landed. Replayed records land after newer ones of their shard."),
        epilog=_epilog(f"{PROG} replay --from-dlq dead.jsonl --to tuple --datahub-endpoint URL --project dts "
                       "--datahub-topic '{db}_{table}' --schema-change lenient"))
    replay.add_argument("--from-dlq", required=True, metavar="PATH", help="the dead-letter file sync wrote")
    _add_datahub_flags(replay, "as sync's: Blob a topic (or {db}), Tuple a template with {table}")
    replay.add_argument("--schema-change", choices=("evolve", "lenient", "ignore", "fail"), default=None,
                        help="as sync's (Tuple)")
    replay.add_argument("--rejects", metavar="PATH", help="with --on-error skip: letters that still fail")
    replay.add_argument("--json", action="store_true", help="print the counts as one JSON document")
    add_option_flags(replay)
    replay.set_defaults(run=cmd_replay)
