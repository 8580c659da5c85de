"""The reverse pipeline: DataHub (Blob or Tuple topics) -> whole Entries -> DTS Envelopes in Kafka,
exactly once (`dts-bridge sync --to dts`, docs/kafka.md "DataHub -> Kafka").

It is the forward pipeline's loop with the other pair of parts, nothing else:

| seam       | forward (`bridge.sync`)         | reverse (here)                                             |
|------------|---------------------------------|------------------------------------------------------------|
| Source     | `kafka.KafkaSource`             | `datahub.source.DataHubSource` (shards, splits, merges)    |
| Assembler  | `stream.pipeline.DtsAssembler`  | `stream.shards.DataHubAssembler` (shards merged per stream)|
| convert    | BlobEncoder / TupleEncoder      | none: the Entry itself                                     |
| Sink       | `sync.BlobSink` / `TupleSink`   | `kafka.DtsKafkaSink` (Envelopes, per-table partitions)     |
| Positions  | `kafka.GroupOffsets` / file     | `kafka.TransactionalPositions` (same transaction), or a file + the sink's tail look |

With `subscriptions` (`--subscription ID`), every commit of positions is also copied to those DataHub
subscriptions (`datahub.subscription.SubscriptionOffsets`, on a thread of its own), for DataHub's
lag view only: they are never read back, and their failures never stop or slow the run.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bridge.datahub.source import DataHubSource, key_text, parse_key
from bridge.datahub.subscription import SubscriptionOffsets, find_subscriptions
from bridge.kafka import DtsKafkaSink, FileOffsets, TailPositions, TransactionalPositions, transactional_id_for
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.pipeline import run
from bridge.pipeline.options import FETCH_PROCESS
from bridge.stream import ErrorPolicy
from bridge.stream.pipeline import Report
from bridge.stream.shards import DataHubAssembler, DataHubRecord

__all__ = ["KAFKA_MAX_MESSAGE_BYTES", "ToDts", "datahub_source_of", "sync_to_dts"]

# The largest Envelope written unless Options.max_message_bytes says otherwise: under a broker's default
# max.message.bytes (1,048,588), with room for the record's framing and its dts-bridge-pos header.
# (Options' own default, 1 MiB, is for .pb files: Envelopes that size are refused by such a broker.)
KAFKA_MAX_MESSAGE_BYTES = 1_000_000


def datahub_source_of(where: dict) -> tuple | None:
    """(source key, order token) of an Entry the DataHub assembler handed on: its shard and the
    sequence of the record that completed it (records are handed on in shard order)."""
    if not where or "shard" not in where or "sequence" not in where:
        return None
    text = where["shard"]
    key = _PARSED.get(text)
    if key is None:  # (a shard's text is parsed once: one per Entry was 2% of a run)
        if len(_PARSED) >= 4096:
            _PARSED.clear()
        key = _PARSED[text] = parse_key(text)
    return key, (where["sequence"],)


_PARSED: dict = {}  # "topic:shard" -> (topic, shard)


@dataclass
class ToDts:
    """The parts of one reverse pipeline, built by `sync_to_dts` (the CLI reads its counts)."""
    source: DataHubSource
    assembler: DataHubAssembler
    sink: DtsKafkaSink
    positions: object
    report: Report
    subscription: SubscriptionOffsets | None = None


def sync_to_dts(client, project: str, datahub_topic: str | list[str], kafka_config: dict, kafka_topic: str,
                policy: ErrorPolicy, options: Options = DEFAULT_OPTIONS, *, from_beginning: bool = False,
                since_ms: int | None = None, transactions: bool = True, transactional_id: str | None = None,
                offsets_file: str | None = None, partition_by: str = "table", fail_on_data_loss: bool = True,
                max_records: int | None = None, idle_timeout: float | None = None,
                stop: Callable[[], bool] = lambda: False, commit_interval: float | None = 5.0,
                max_retries: int = 12, settle: float = 1.0, max_held: int = 100_000,
                stall_seconds: float | None = 300.0, report: Report | None = None,
                started: Callable[[ToDts], None] | None = None, subscriptions: Sequence[str] = (),
                subscription_client=None, subscription_log: Callable[[str], None] | None = None,
                subscription_wait: float = 5.0, fetch_process: str = "auto") -> ToDts:
    """Read `datahub_topic` of `project` (a Blob topic, Tuple topics by list or `{db}_{table}`
    template) from the committed positions (else the oldest record with `from_beginning`, else
    `since_ms`, else the end), rebuild whole Entries and write them to `kafka_topic` as DTS
    Envelopes. With `transactions` the records and the DataHub positions are committed in one
    Kafka transaction (offsets topic); without, positions go to `offsets_file` and a restart looks
    at each output partition's tail. `settle`: seconds a shard must be seen at its end before it
    counts as holding nothing earlier (a writer still writing: docs/kafka.md, "Reading DataHub").
    `max_held`, `stall_seconds`: the merge's bounds (docs/kafka.md, "Reading DataHub: stalls").
    `started(parts)` is called once the parts exist (the CLI watches them). Envelopes are packed
    under `options.max_message_bytes` when it was set, else KAFKA_MAX_MESSAGE_BYTES.

    `subscriptions`: DataHub subscription ids, each of one of the topics read (else
    `UnknownSubscription`, before anything is written), to which every commit is copied through
    `subscription_client` (default `client`; give a client of its own: the copying runs on another
    thread), `subscription_log(text)` hearing its failures; at the end, up to `subscription_wait`
    seconds go to sending the last positions.

    `fetch_process` (FETCH_PROCESS): how the source fetches pages of a Blob topic. auto: reader
    threads, then its fetch process once they fetched `DataHubSource.process_after` pages; always:
    the fetch process from the first page (started as the source opens); never: reader threads only."""
    if fetch_process not in FETCH_PROCESS:
        raise ValueError(f"fetch_process must be one of {', '.join(FETCH_PROCESS)}, not {fetch_process!r}")
    name = datahub_topic if isinstance(datahub_topic, str) else ",".join(datahub_topic)
    tid = (transactional_id or transactional_id_for(project, name, kafka_topic)) if transactions else None
    assembler = DataHubAssembler(options, settle=settle, max_buffered=max_held, stall_seconds=stall_seconds)
    source = DataHubSource(client, project, datahub_topic, from_beginning=from_beginning, since_ms=since_ms,
                           fail_on_data_loss=fail_on_data_loss, max_retries=max_retries,
                           wants_tick=assembler.waiting, processes=fetch_process != "never")
    if fetch_process == "always":
        source.process_after = 0
    mirror = None
    if subscriptions:
        sub_client = subscription_client if subscription_client is not None else client
        mirror = SubscriptionOffsets(sub_client, project, find_subscriptions(sub_client, project, source.topics,
                                                                             subscriptions),
                                     log=subscription_log)
    limit = options.max_message_bytes
    if limit == DEFAULT_OPTIONS.max_message_bytes:
        limit = KAFKA_MAX_MESSAGE_BYTES
    sink = DtsKafkaSink(kafka_config, kafka_topic, transactional_id=tid, transactions=transactions,
                        partition_by=partition_by, max_message_bytes=limit,
                        key_text=key_text, source_of=datahub_source_of)
    if transactions:
        positions = TransactionalPositions(sink, key_text=key_text, parse_key=parse_key)
    else:
        if not offsets_file:
            raise ValueError("without transactions the DataHub positions go to a file: give offsets_file")
        positions = TailPositions(_KeyedFile(FileOffsets(offsets_file, name)), sink)
    parts = ToDts(source, assembler, sink, positions, report if report is not None else Report(), mirror)
    if started is not None:
        started(parts)
    reading, saving = (source, positions) if mirror is None else (_Seen(source, mirror), _Mirrored(positions, mirror))
    if mirror is not None:
        mirror.start()
    try:
        run(reading, saving, assembler, lambda entry: entry, sink, policy, max_records=max_records,
            idle_timeout=idle_timeout, stop=stop, report=parts.report, size=lambda entry: 1,
            commit_interval=commit_interval)
    finally:
        try:
            source.close()  # its reader threads stop now, not after their idle time
        finally:
            try:
                sink.close()
            finally:
                if mirror is not None:
                    mirror.close(wait=subscription_wait)
    return parts


class _Seen:
    """The source, telling the subscription mirror each record's system time as it is read."""

    def __init__(self, source, mirror: SubscriptionOffsets) -> None:
        self.source, self.mirror = source, mirror

    def poll(self, budget: int, timeout: float) -> list:
        batch = self.source.poll(budget, timeout)
        for key, sequence, value, _ in batch:
            if isinstance(value, DataHubRecord):
                self.mirror.seen(key, sequence, value.system_time)
        return batch

    def __getattr__(self, name: str):
        return getattr(self.source, name)


class _Mirrored:
    """The positions store, copying each commit to the DataHub subscriptions once it is done."""

    def __init__(self, positions, mirror: SubscriptionOffsets) -> None:
        self.positions, self.mirror = positions, mirror

    @property
    def times(self) -> dict:
        return getattr(self.positions, "times", {})

    def load(self, keys: list) -> dict:
        return self.positions.load(keys)

    def save(self, commit: dict, read: dict) -> None:
        self.positions.save(commit, read)
        self.mirror.committed(commit)


class _KeyedFile:
    """FileOffsets keyed by text: DataHub keys are (topic, shard) pairs, stored as "topic:shard"."""

    def __init__(self, store: FileOffsets) -> None:
        self.store = store

    @property
    def times(self) -> dict:
        return self.store.times

    def load(self, keys: list) -> dict:
        got = self.store.load([key_text(k) for k in keys])
        return {parse_key(k): v for k, v in got.items()}

    def save(self, commit: dict, read: dict) -> None:
        self.store.save({key_text(k): v for k, v in commit.items()}, {key_text(k): v for k, v in read.items()})
