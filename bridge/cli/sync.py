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
    add_pipeline_flags,
    ledger_sink,
    options_from,
    pipeline_options_from,
    rejects_sink,
)
from bridge.cli.kafka import (
    _add_kafka_flags,
    _add_reading_flags,
    _add_watch_flags,
    _check_reading_args,
    _consumer_config,
    _graceful_stop,
    _kafka_config,
    _mirror_reading,
    _watching,
)
from bridge.errors import BridgeError
from bridge.pipeline.options import FETCH_PROCESS
from bridge.stream import ErrorPolicy, Tally
from bridge.stream.pipeline import Report
from bridge.values import signed_digits

__all__ = ["register", "cmd_sync", "cmd_replay"]


def _check_routing_flags(args, popts) -> None:
    """Flag combinations that make no sense, refused before anything starts."""
    dlq = popts.on_table_error in ("dlq", "halt-table") or popts.oversized == "dlq"
    if dlq and not getattr(args, "dead_letters", None):
        raise UsageError("--on-table-error dlq|halt-table and --oversized dlq write dead letters: pass --dead-letters PATH")
    if args.to == "tuple" and "{table}" not in args.datahub_topic:
        raise UsageError("--to tuple writes one topic per table: --datahub-topic needs {table} (e.g. '{db}_{table}')")
    if args.to == "blob" and "{table}" in args.datahub_topic:
        raise UsageError("--to blob writes one topic, or one per database ({db}): --datahub-topic takes no {table}")
    if args.to == "blob" and popts.schema_change != "evolve":
        raise UsageError("--schema-change is for --to tuple (Blob topics carry DDL messages as they come)")


def _check_dead_letters_topic(dead_letters: str | None) -> None:
    """--dead-letters kafka:TOPIC names a topic Kafka accepts (checked before anything connects)."""
    if not dead_letters or not dead_letters.startswith("kafka:"):
        return
    from bridge.kafka.deadletters import topic_problem
    name = dead_letters[len("kafka:"):]
    if not name:
        raise UsageError("--dead-letters kafka:TOPIC needs a topic name")
    problem = topic_problem(name)
    if problem is not None:
        raise UsageError(f"--dead-letters kafka:TOPIC: {problem}")


def _sinks(args, popts, writer, policy, source: str, options, letters, oversized: str | None = None):
    """(sink, gate) for --to blob|tuple with routing, the table-error policy and dead letters."""
    from bridge import sync
    return sync.make_sink(args.to, writer, args.datahub_topic, source, policy, options,
                          include=getattr(args, "include", None), exclude=getattr(args, "exclude", None),
                          on_table_error=popts.on_table_error, schema_change=popts.schema_change,
                          oversized=oversized or popts.oversized, letters=letters)


PROBE_SECONDS = 5.0  # how long the endpoint check waits for an answer


def _datahub_client(endpoint: str, project: str, compress: str):
    """A DataHub client, after checking the endpoint as a user would want it checked before a long
    run starts: an http(s) URL, credentials set, something that answers within PROBE_SECONDS, and
    answers as DataHub does (its x-datahub-request-id header). Each failure is one usage line."""
    import re
    from urllib.parse import urlsplit

    import requests

    from bridge.datahub.sink import DataHubError, make_client
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--datahub-endpoint must be an http:// or https:// URL, not {endpoint!r}")
    try:
        client = make_client(endpoint, compress=compress)
    except DataHubError as err:
        raise UsageError(str(err)) from None
    try:
        answer = requests.get(endpoint.rstrip("/") + f"/projects/{project}", timeout=PROBE_SECONDS)
    except requests.exceptions.Timeout:
        raise UsageError(f"DataHub at {endpoint} did not answer within {PROBE_SECONDS:g} s") from None
    except requests.exceptions.RequestException as exc:
        text = str(exc.args[0] if exc.args else exc)
        errno = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)  # the OS's reason, deep in urllib3's text
        reason = errno.group(1).strip() if errno else text.splitlines()[0][:300]
        raise UsageError(f"cannot reach DataHub at {endpoint}: {reason}") from None
    if "x-datahub-request-id" not in {k.lower() for k in answer.headers}:
        kind = answer.headers.get("Content-Type", "no content type").split(";")[0]
        title = re.search(rb"<title>(.*?)</title>", answer.content[:65536], re.I | re.S)
        what = f", titled {title.group(1).decode('utf-8', 'replace').strip()[:80]!r}" if title else ""
        raise UsageError(f"{endpoint} does not answer as DataHub does (HTTP {answer.status_code}, {kind}{what}): "
                         f"check --datahub-endpoint")
    return client


def _since_ms(text: str | None) -> int | None:
    """--since: epoch milliseconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    if text is None:
        return None
    import datetime
    if signed_digits(text.strip()):
        return int(text)
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since takes epoch milliseconds or an ISO 8601 time, not {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return int(when.timestamp() * 1000)


def cmd_sync_to_dts(args: argparse.Namespace) -> int:
    """sync --to dts: DataHub -> whole Entries -> DTS Envelopes in Kafka (bridge.pipeline.to_dts)."""
    from bridge.cli import observe
    from bridge.pipeline.to_dts import sync_to_dts
    popts = pipeline_options_from(args)
    if args.no_transactions and not args.offsets_file:
        raise UsageError("--no-transactions keeps the DataHub positions in a file: pass --offsets-file PATH")
    if args.rejects and getattr(args, "opt_on_error", "fail") != "skip":
        raise UsageError("--rejects needs --on-error skip (under fail the first bad record stops the run)")
    options = options_from(args, {"dts", "pb", "blob", "tuple"})  # Envelopes out: --max-message-bytes applies
    label = f"{PROG} sync {args.project}/{args.datahub_topic} -> {args.topic}"
    topics = args.datahub_topic.split(",") if "," in args.datahub_topic else args.datahub_topic
    tally = Tally()
    rejects = open(args.rejects, "ab") if args.rejects else None
    policy = ErrorPolicy(getattr(args, "opt_on_error", "fail"), tally=tally, sink=rejects_sink(rejects, tally),
                         keep_records=False, ledger=None)
    report = Report()
    parts: list = []
    metrics = observe.Metrics()

    shard_lag = metrics.gauge("datahub_shard_lag", "records of a DataHub shard not yet committed (its end less the "
                              "committed sequence)", ["topic", "shard"])
    committed_seq = metrics.gauge("datahub_committed_sequence", "next DataHub sequence committed, per shard",
                                  ["topic", "shard"])
    entries_out = metrics.counter("kafka_entries_written", "Entries written to Kafka (committed or not yet)",
                                  ["partition"])
    transactions = metrics.counter("kafka_transactions", "Kafka transactions committed")
    last_commit = metrics.gauge("last_commit_timestamp_seconds", "when positions were last committed")
    sub_commits = metrics.counter("subscription_commits", "offset commits to the DataHub subscriptions "
                                  "(--subscription) that went through")
    sub_failures = metrics.counter("subscription_commit_failures", "offset commits to the DataHub subscriptions "
                                   "that failed (the pipeline goes on), by DataHub error code", ["reason"])
    held = metrics.gauge("merge_records_held", "DataHub records the shard merge holds, waiting for the other shards")
    stalled = metrics.gauge("merge_stalled_seconds", "seconds the shard merge has held records with none handed on "
                            "(0: not stalled)")
    stalls = metrics.counter("merge_stalls_decided", "stalls the shard merge decided (a head handed on though "
                             "not covered: docs/kafka.md, 'Reading DataHub: stalls')")
    duplicates = metrics.counter("datahub_duplicates_dropped", "DataHub records dropped as copies of a record "
                                 "handed on (a writer's retry)")

    def refresh(metrics: observe.Metrics) -> None:
        metrics.count_tally(tally)
        metrics.count_to(metrics.records_in, report.envelopes)
        for key, lag in report.lag().items():
            shard_lag.labels(topic=str(key[0]), shard=str(key[1])).set(lag)
        for key, seq in list(report.committed.items()):
            committed_seq.labels(topic=str(key[0]), shard=str(key[1])).set(seq)
        metrics.count_to(duplicates, tally.duplicates)
        if parts:
            sink = parts[0].sink
            assembler = parts[0].assembler
            held.set(assembler.held())
            stall = assembler.stall
            stalled.set(stall["seconds"] if stall else 0)
            metrics.count_to(stalls, assembler.stalls)
            for partition, count in list(getattr(sink, "per_partition", {}).items()):
                metrics.count_to(entries_out, count, partition=str(partition))
            metrics.count_to(transactions, sink.commits)
            mirror = parts[0].subscription
            if mirror is not None:
                metrics.count_to(sub_commits, mirror.commits)
                for reason, count in list(mirror.reasons.items()):
                    metrics.count_to(sub_failures, count, reason=reason)
        if report.last_commit_at is not None:
            last_commit.set(report.last_commit_at)

    def render(status) -> str:
        sink = parts[0].sink if parts else None
        written = sink.written if sink is not None else 0
        lag = report.lag()
        text = (f"{report.envelopes:,} DataHub records ({observe.rate_text(status.rate('in', report.envelopes))}), "
                f"{written:,} Entries to Kafka, {tally.rejected:,} rejected, {report.commits:,} commits")
        if tally.duplicates:
            text += f", {tally.duplicates:,} duplicates dropped"
        text += ", lag " + " ".join(f"{k[0]}/{k[1]}:{n:,}" for k, n in sorted(lag.items())) if lag else ""
        stall = parts[0].assembler.stall if parts else None
        if stall:  # what holds the merge back, first, as WAITING does for the forward sync
            text = (f"STALLED {stall['seconds']:.0f} s: shard {stall['shard']} sequence {stall['sequence']} "
                    f"({stall['stream']}) waits for the other shards, {stall['held']:,} records held (decided "
                    f"at --max-held or --stall-seconds); " + text)
        return text

    def say(text: str) -> None:
        print(f"{label}: {text}", file=sys.stderr, flush=True)

    from bridge.datahub.subscription import UnknownSubscription
    try:
        with _graceful_stop() as stop, _watching(args, label, metrics, render, refresh):
            client = _datahub_client(args.datahub_endpoint, args.project, popts.compress)
            sub_client = None
            if args.subscription:  # a client of its own: the subscription commits run on another thread
                from bridge.datahub.calls import make_client
                sub_client = make_client(args.datahub_endpoint, compress=popts.compress)
            done = sync_to_dts(client, args.project, topics,
                               _kafka_config(args), args.topic, policy, options,
                               from_beginning=args.from_beginning, since_ms=_since_ms(args.since),
                               transactions=not args.no_transactions, transactional_id=args.transactional_id,
                               offsets_file=args.offsets_file, partition_by=args.partition_by,
                               fail_on_data_loss=not args.accept_data_loss, max_records=args.max_messages,
                               idle_timeout=args.idle_timeout, stop=stop,
                               commit_interval=popts.commit_interval or None, max_retries=popts.max_retries,
                               report=report, started=parts.append, subscriptions=args.subscription or (),
                               subscription_client=sub_client, subscription_log=say,
                               fetch_process=args.fetch_process, max_held=popts.max_held,
                               stall_seconds=popts.stall_seconds)
    except UnknownSubscription as err:
        raise UsageError(str(err)) from None
    except BridgeError as err:  # the summary (and --json's report) end every run that got going
        if not parts:
            raise
        report.stopped = f"error: {type(err).__name__}"
        _to_dts_summary(args, label, tally, report, parts[0], error=err)
        raise
    finally:
        if rejects is not None:
            rejects.close()
    _to_dts_summary(args, label, tally, report, done)
    return 1 if tally.rejected else 0


def _to_dts_summary(args, label: str, tally, report, done, error: BaseException | None = None) -> None:
    """The summary line of `sync --to dts` (and, with --json, its report), on every ending: Entries
    counted as read_committed consumers see them (in committed transactions) beside those written."""
    sink = done.sink
    committed = ", ".join(f"{k[0]}/{k[1]}:{o}" for k, o in sorted(report.committed.items())) or "nothing new"
    visible = sink.committed if sink.transactions else sink.written
    if args.json:
        doc = {"datahub_topic": args.datahub_topic, "kafka_topic": args.topic, "input": tally.input,
               "converted": tally.converted, "rejected": tally.rejected, "not_emitted": tally.not_emitted,
               "duplicates": tally.duplicates, "stalls": done.assembler.stalls, "entries_written": sink.written,
               "entries_committed": visible, "kafka_messages": sink.messages, "already_landed": sink.skipped,
               "transactions": sink.commits, "records": report.envelopes, "commits": report.commits,
               "committed": {f"{k[0]}/{k[1]}": o for k, o in sorted(report.committed.items())},
               "subscription": done.subscription.report() if done.subscription is not None else None,
               "stopped": report.stopped, "error": str(error) if error is not None else None}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        sys.stdout.flush()
    aborted = f", {sink.written - visible} rolled back (written again by the next run)" \
        if sink.transactions and sink.written > visible else ""
    print(f"{label}: {tally.summary()}; {visible} Entries committed to Kafka{aborted} in {sink.commits} "
          f"transactions, {sink.messages} messages ({sink.skipped} found already there); read {report.envelopes} "
          f"DataHub records; committed {committed}; stopped: {report.stopped}"
          + (_subscription_summary(done.subscription) if done.subscription is not None else ""), file=sys.stderr)


def _subscription_summary(mirror) -> str:
    ids = ", ".join(f"{sub} ({topic})" for topic, sub in sorted(mirror.subscriptions.items()))
    text = f"; DataHub subscription {ids}: {mirror.commits} offset commits"
    if mirror.failures:
        reasons = ", ".join(f"{code} {n}" for code, n in sorted(mirror.reasons.items()))
        text += f", {mirror.failures} failed ({reasons}; last: {mirror.last_error})"
    return text


class _WriterEvents:
    """What the DataHub writer tells (`observer(event, **facts)`), made visible: requests and
    retries into the metrics (as observe.Metrics.datahub_observer), a degraded state while a request
    keeps failing (status line, stderr, `datahub_degraded`), the restart look while it reads the
    shards' tails; and the run's own gauges (acknowledged, queued, last commit, source lag)."""

    def __init__(self, label: str, metrics) -> None:
        self.label, self.metrics = label, metrics
        self.requests = metrics.datahub_observer()
        self.acked = metrics.counter("records_acked", "records DataHub acknowledged (landed)")
        self.queued = metrics.gauge("records_queued", "records put to the DataHub writer and not yet acknowledged")
        self.last_commit = metrics.gauge("last_commit_timestamp_seconds", "when offsets were last committed")
        self.source_lag = metrics.gauge("source_lag_milliseconds", "now less the source time of the last Entry "
                                        "handed on (MilliSecondsBehindSource)")
        self.degraded_gauge = metrics.gauge("datahub_degraded", "1 while a DataHub request keeps failing")
        self.degraded: str | None = None
        self.looking: str | None = None

    def __call__(self, event: str, **facts) -> None:
        if event == "degraded":
            self.degraded = (f"{facts.get('request')} failing for {float(facts.get('seconds') or 0):.0f} s "
                             f"({facts.get('reason')}); retrying")
            self.degraded_gauge.set(1)
            print(f"{self.label}: DataHub degraded: {self.degraded}", file=sys.stderr)
        elif event == "recovered":
            print(f"{self.label}: DataHub recovered: {facts.get('request')} succeeded after "
                  f"{float(facts.get('seconds') or 0):.0f} s", file=sys.stderr)
            self.degraded = None
            self.degraded_gauge.set(0)
        elif event == "look":
            state = facts.get("state")
            if state == "start":
                self.looking = f"scanning the tails of {facts.get('shards')} shards of {facts.get('topic')}"
                print(f"{self.label}: {self.looking} for records that landed after the last commit", file=sys.stderr)
            elif state == "done":
                self.looking = None
                print(f"{self.label}: scanned {facts.get('topic')}: {facts.get('records')} records in "
                      f"{facts.get('requests')} requests", file=sys.stderr)
        else:
            self.requests(event, **facts)


class _SayWhereToStart:
    """An offset store that says, once per partition, where a partition without a committed offset
    starts (a new group starts at the latest message unless --from-beginning: say so)."""

    def __init__(self, store, label: str, where: str, start: str) -> None:
        self.store, self.label, self.where, self.start = store, label, where, start
        self.said: set = set()

    @property
    def times(self) -> dict:
        return getattr(self.store, "times", {})

    def load(self, keys: list) -> dict:
        got = self.store.load(keys)
        new = sorted(k for k, (off, _) in got.items() if off is None and k not in self.said)
        if new:
            self.said.update(new)
            hint = "" if self.start == "earliest" else " (--from-beginning starts a new group at the earliest)"
            print(f"{self.label}: partition{'s' if len(new) > 1 else ''} {', '.join(map(str, new))}: no committed "
                  f"offset in {self.where}, starting at the {self.start} message{hint}", file=sys.stderr)
        return got

    def save(self, commit: dict, read: dict) -> None:
        self.store.save(commit, read)


# the flags of the "--to dts" group, with their defaults: given to the forward sync they would be
# ignored, so they are refused
_TO_DTS_ONLY = (("since", None), ("transactional_id", None), ("no_transactions", False), ("partition_by", "table"),
                ("subscription", None), ("accept_data_loss", False), ("fetch_process", "auto"))


def cmd_sync(args: argparse.Namespace) -> int:
    if args.to == "dts":
        return cmd_sync_to_dts(args)
    given = ["--" + name.replace("_", "-") for name, default in _TO_DTS_ONLY if getattr(args, name, default) != default]
    if given:
        raise UsageError(f"{', '.join(given)}: only with --to dts (DataHub -> Kafka); sync --to {args.to} reads Kafka")
    from bridge import kafka, sync
    from bridge.cli import observe
    from bridge.datahub.sink import DataHubWriter
    _check_reading_args(args)
    popts = pipeline_options_from(args)
    _check_routing_flags(args, popts)
    _check_dead_letters_topic(args.dead_letters)
    from bridge.deadletters import DeadLetters
    options = options_from(args, {"dts", args.to})
    label = f"{PROG} sync {args.topic} -> {args.project}"
    metrics = observe.Metrics()
    client = _datahub_client(args.datahub_endpoint, args.project, popts.compress)
    creating = {"shards": popts.shards, "lifecycle": popts.lifecycle} if popts.create_topics else None
    events = _WriterEvents(label, metrics)
    writer = DataHubWriter(client, args.project, batch_records=popts.batch_size, workers=popts.workers,
                           max_retries=popts.max_retries, create_topics=creating, observer=events,
                           max_buffered=popts.max_buffered,
                           retry_timeout=None if popts.retry_timeout < 0 else popts.retry_timeout)
    config = _consumer_config(args, label)
    # while the writer's bounded buffer blocks the loop, librdkafka prefetches at most this much
    config.setdefault("queued.max.messages.kbytes", 16384)
    # a member of its consumer group unless partitions are given by hand or offsets kept in a file
    subscribe = bool(args.group) and args.partitions is None and not args.offsets_file
    if subscribe:
        config.setdefault("partition.assignment.strategy", "cooperative-sticky")
        # a member killed without leaving keeps its partitions this long (librdkafka's default: 45 s)
        config.setdefault("session.timeout.ms", 10_000)
        if args.instance_id:  # static membership: a restart with the same id takes its partitions back at once
            config["group.instance.id"] = args.instance_id
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
    if args.dead_letters and args.dead_letters.startswith("kafka:"):
        from bridge.kafka.deadletters import KafkaDeadLetters
        # librdkafka's log through the consumer's logger: deduplicated, WARNING+ unless -v
        letters = KafkaDeadLetters({**_kafka_config(args), "logger": config["logger"]},
                                   args.dead_letters[len("kafka:"):], args.topic,
                                   halt_tables=popts.on_table_error == "halt-table")
        letters.restore()
    elif args.dead_letters:
        letters = DeadLetters(args.dead_letters, {
            "topic": args.topic, "store": f"group {args.group}" if not args.offsets_file else f"file {args.offsets_file}",
            "read_partitions": args.partitions})
        letters.restore()
    seen = [0.0, 0.0]  # PutRecordsByShard count and seconds at the last status line

    def refresh(metrics: observe.Metrics) -> None:
        _mirror_reading(metrics, args.topic, tally, report)
        metrics.count_to(events.acked, writer.acked)
        events.queued.set(writer.queued)
        if report.last_commit_at is not None:
            events.last_commit.set(report.last_commit_at)
        lag_ms = report.source_lag_ms()
        if lag_ms is not None:
            events.source_lag.set(lag_ms)

    def render(status) -> str:
        count = metrics.value("datahub_request_seconds_count", request="PutRecordsByShard") or 0
        total = metrics.value("datahub_request_seconds_sum", request="PutRecordsByShard") or 0.0
        latency = (total - seen[1]) / (count - seen[0]) if count > seen[0] else None
        seen[:] = [count, total]
        lag = report.lag()
        acked = writer.acked
        parts = [f"{report.envelopes:,} Envelopes ({observe.rate_text(status.rate('in', report.envelopes))})",
                 f"{acked:,} records acknowledged by DataHub ({observe.rate_text(status.rate('out', acked))}), "
                 f"{writer.queued:,} queued",
                 f"{tally.rejected:,} rejected", f"{writer.retries:,} DataHub retries ({writer.throttled:,} throttled)",
                 f"{writer.skipped:,} found already there"]
        if events.degraded is not None:
            parts.insert(0, f"DEGRADED: {events.degraded}")
        import time as _time
        if report.silent_since is not None:
            parts.insert(0, f"KAFKA NOT ANSWERING for {_time.time() - report.silent_since:.0f} s")
        waiting = report.waiting
        if waiting is not None and _time.time() - waiting[1] >= 5:
            what = ("for DataHub to acknowledge" if waiting[0] == "sink" else
                    "to commit offsets (is the Kafka broker answering?)")
            parts.insert(0, f"WAITING {_time.time() - waiting[1]:.0f} s {what}")
        if events.looking is not None:
            parts.insert(0, events.looking)
        if report.last_commit_at is not None:
            import time as _time
            parts.append(f"last commit {_time.time() - report.last_commit_at:.0f} s ago")
        lag_ms = report.source_lag_ms()
        if lag_ms is not None:
            parts.append(f"{lag_ms / 1000:.1f} s behind the source")
        if latency is not None:
            parts.append(f"latency {latency * 1000:.0f} ms")
        if lag:
            parts.append("lag " + " ".join(f"{p}:{n:,}" for p, n in sorted(lag.items())))
        return ", ".join(parts)

    try:
        policy = ErrorPolicy(getattr(args, "opt_on_error", "fail"), tally=tally,
                             sink=rejects_sink(rejects, tally), keep_records=False, ledger=ledger_sink(ledger))
        sink, convert = _sinks(args, popts, writer, policy, args.topic, options, letters)
        store = (kafka.FileOffsets(args.offsets_file, args.topic) if args.offsets_file
                 else kafka.GroupOffsets(consumer, args.topic))
        store = _SayWhereToStart(store, label, f"file {args.offsets_file}" if args.offsets_file
                                 else f"group {args.group}", "earliest" if args.from_beginning else "latest")
        bar = observe.progress(unit="records", enabled=False if args.no_progress else None, desc=label,
                               describe=lambda: f"{tally.rejected:,} rejected, {writer.retries:,} retries")
        with contextlib.closing(bar), _graceful_stop() as stop, _watching(args, label, metrics, render, refresh):
            bar.follow(lambda: writer.acked)
            report = sync.run(consumer, args.topic, store, writer, sink, convert, policy,
                              partitions=args.partitions, start="earliest" if args.from_beginning else "latest",
                              max_messages=args.max_messages, idle_timeout=args.idle_timeout, stop=stop,
                              raw=args.to == "blob", commit_interval=popts.commit_interval or None, report=report,
                              subscribe=subscribe)
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
               "written": sink.written, "acknowledged": writer.acked, "already_landed": writer.skipped,
               "datahub_requests": writer.requests,
               "datahub_retries": writer.retries, "dead_letters": letters.written if letters else 0,
               "refused_by_datahub": writer.refused, "halted_tables": dict(sink.tables.halted) if sink.tables else {},
               "schema_ignored": dict(getattr(sink, "ignored", {})),
               "evolved": [{"topic": t, "fields": f} for t, f, _ in getattr(sink, "evolved", [])],
               **report.as_dict()}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        sys.stdout.flush()
    print(f"{label}: {tally.summary()}; {writer.acked} records acknowledged by DataHub ({writer.skipped} found already "
          f"there), {writer.requests} requests, {writer.retries} retries; read {report.envelopes} Envelopes "
          f"({report.held} held in unfinished Entries); committed {committed}; stopped: {report.stopped}"
          + (f"; {letters.written} dead letters to {args.dead_letters}" if letters else "")
          + (f"; halted tables: {', '.join(sorted(sink.tables.halted))}" if sink.tables and sink.tables.halted else "")
          + "".join(f"; {t}: {c['values']} values of {c['rows']} rows left out ({', '.join(c['fields'])}: "
                    f"--schema-change ignore)" for t, c in sorted(getattr(sink, "ignored", {}).items())),
          file=sys.stderr)
    return 1 if tally.rejected else 0


def _add_delivery_flags(parser) -> None:
    add_pipeline_flags(parser, ("schema_change", "on_table_error", "oversized"))
    parser.add_argument("--dead-letters", metavar="PATH|kafka:TOPIC",
                        help="JSON Lines of Entries and records not delivered (the Entry's bytes, position, table, "
                             "error, topic); fsynced before every commit, cut back to the commit on restart. "
                             "kafka:TOPIC: the same documents as records of a Kafka topic (on the --brokers "
                             "cluster, created compacted), keyed by position, acknowledged before every commit")


def cmd_replay(args: argparse.Namespace) -> int:
    from bridge import sync
    from bridge.datahub.sink import DataHubWriter
    from bridge.deadletters import read_dead_letters
    args.include = args.exclude = None
    popts = pipeline_options_from(args, on_table_error=None, oversized="fail")
    _check_routing_flags(args, popts)
    letters = read_dead_letters(args.from_dlq)
    options = options_from(args, {"dts", args.to})
    tally = Tally()
    rejects = open(args.rejects, "ab") if args.rejects else None
    policy = ErrorPolicy(getattr(args, "opt_on_error", "fail"), tally=tally, sink=rejects_sink(rejects, tally),
                         keep_records=False)
    creating = {"shards": popts.shards, "lifecycle": popts.lifecycle} if popts.create_topics else None
    writer = DataHubWriter(_datahub_client(args.datahub_endpoint, args.project, popts.compress), args.project,
                           batch_records=popts.batch_size, max_retries=popts.max_retries, create_topics=creating)
    source = (letters[0]["source"] if letters else "") + sync.REPLAY_SUFFIX
    try:
        # a letter still oversized is rejected under --on-error, like any other
        sink, gate = _sinks(args, popts, writer, policy, source, options, None, oversized="policy")
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


def _add_datahub_flags(parser, topic_help: str, to=("blob", "tuple")) -> None:
    """Where and how records go to DataHub (sync and replay)."""
    parser.add_argument("--to", choices=to, default="blob",
                        help="DataHub record type (default: blob)" + ("; dts: the other way, DataHub -> Kafka DTS "
                                                                      "Envelopes" if "dts" in to else ""))
    parser.add_argument("--datahub-endpoint", required=True, metavar="URL", help="DataHub endpoint")
    parser.add_argument("--project", required=True, help="DataHub project")
    parser.add_argument("--datahub-topic", required=True, metavar="NAME", help=topic_help)
    add_pipeline_flags(parser, ("create_topics", "shards", "lifecycle", "batch_size", "max_retries", "compress"))


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
            "$DATAHUB_ACCESS_ID, $DATAHUB_ACCESS_KEY. With --to dts, the other way: read DataHub topics (filled by "
            "this bridge, DataWorks or any writer), rebuild whole Entries as convert does and write them to a Kafka "
            "topic as DTS Envelopes, in Kafka transactions with the DataHub positions (its options are in the "
            "'--to dts' group below; docs/kafka.md, 'DataHub -> Kafka in ten minutes')."),
        epilog=_epilog(f"{PROG} sync --brokers dts.example:9092 --topic topic-subs-1 --group grp-1 --to blob "
                       "--datahub-endpoint https://dh-cn-hangzhou.aliyuncs.com --project dts --datahub-topic orders_blob",
                       f"{PROG} sync --brokers h:9092 --topic t --group g --to tuple --datahub-endpoint URL "
                       "--project dts --datahub-topic '{db}_{table}' --from-beginning",
                       f"{PROG} sync --to dts --datahub-endpoint URL --project dts --datahub-topic orders_blob "
                       "--brokers h:9092 --topic dts-back --from-beginning",
                       f"{PROG} sync --to dts --datahub-endpoint URL --project dts --datahub-topic '{{db}}_{{table}}' "
                       "--brokers h:9092 --topic dts-back --on-error skip --rejects rejects.jsonl --stall-seconds 60"))
    _add_kafka_flags(parser)
    _add_reading_flags(parser)
    _add_datahub_flags(parser, "Blob: the topic (or one per database with {db}); Tuple: a template with {db} and "
                               "{table}, e.g. '{db}_{table}'; with --to dts the topic(s) read: a Blob topic, Tuple "
                               "topics by a comma-separated list or a template", to=("blob", "tuple", "dts"))
    back = parser.add_argument_group("--to dts (DataHub -> Kafka)")
    back.add_argument("--since", metavar="TIME", help="shards without a committed position start at this time "
                      "(epoch ms or ISO 8601); default: --from-beginning's oldest record, else the end")
    back.add_argument("--transactional-id", metavar="ID", help="Kafka transactional.id (default: derived from "
                      "the project, the DataHub topic and the Kafka topic: stable, so a restart fences a zombie)")
    back.add_argument("--no-transactions", action="store_true", help="for brokers without transactions: an "
                      "idempotent producer, positions in --offsets-file and record headers, and a look at each "
                      "output partition's tail on restart (exactly-once effect)")
    back.add_argument("--partition-by", choices=("table", "key"), default="table",
                      help="Kafka partition of an Entry: by table (default, as DTS) or by table and primary key")
    back.add_argument("--subscription", action="append", metavar="ID", help="a DataHub subscription of the "
                      "topic read (repeatable: one per topic): each commit is copied to it, for DataHub's console "
                      "lag view only; never read back (the Kafka offsets stay the resume position), and a failing "
                      "copy is counted and logged, never stopping the run. An unknown ID is a usage error")
    back.add_argument("--accept-data-loss", action="store_true", help="records past a topic's lifecycle (the "
                      "committed position is gone) are counted and skipped instead of stopping the run")
    add_pipeline_flags(back, ("max_held", "stall_seconds"))
    back.add_argument("--fetch-process", choices=FETCH_PROCESS, default="auto",
                      help="how DataHub pages are fetched (Blob topics): auto (default): reader threads, then one "
                      "fetch process after 32 pages; always: the fetch process from the first page; never: reader "
                      "threads only. The process moves the HTTP requests, the CRC check and the parse off the "
                      "loop's interpreter: worth it with a free core, else never")
    add_pipeline_flags(parser, ("workers", "max_buffered", "commit_interval", "retry_timeout"))
    parser.add_argument("--instance-id", metavar="ID",
                        help="a member of --group with a static identity (Kafka's group.instance.id): a restart with "
                             "the same id takes its partitions back at once, and a second process with it fences "
                             "the first; one id per process of the group")
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
    add_pipeline_flags(replay, ("schema_change",))
    replay.add_argument("--rejects", metavar="PATH", help="with --on-error skip: letters that still fail")
    replay.add_argument("--json", action="store_true", help="print the counts as one JSON document")
    add_option_flags(replay)
    replay.set_defaults(run=cmd_replay)
