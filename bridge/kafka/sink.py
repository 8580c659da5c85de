"""DTS Envelopes out to Kafka: a pipeline `Sink` that writes whole Entries as the DTS producer
packs them, exactly once (docs/kafka.md, "DataHub -> Kafka: transactions").

`DtsKafkaSink.write(where, entry)` takes one whole `pb.Entry` at a time, in source order. Entries
bound for the same partition are merged into one `Entries` under `max_message_bytes` (an Entry
too large alone is cut into segments, `pack_entries`' framing), so a partition holds its Entries
in source order. Partitions:

- `partition_by="table"` (default, as DTS's own default policy): murmur2 (the Java client's
  default partitioner) of `db.table`, so a table's Entries always share one partition;
- `partition_by="key"`: of `db.table` and the primary-key values of the Entry's first row (the
  old image for an UPDATE or DELETE, else the new one); an Entry is never cut, so a multi-row Entry
  goes whole to its first row's partition; a table without key columns falls back to `table`.

Entries without a table (BEGIN, COMMIT, HEARTBEAT, CHECKPOINT, a DDL on a database) go to
partition 0, the control partition: a fixed place, so a replay puts them where they were, and
one partition sees every transaction boundary in source order.

Two modes:

- transactional (default): one `transactional.id` (stable per pipeline: `transactional_id_for`),
  `init_transactions()` on start (fencing a zombie with the same id and aborting its open
  transaction), every record written inside a transaction that `TransactionalPositions.save`
  commits together with the source positions (bridge/kafka/transactions.py);
- `transactions=False`: an idempotent producer (`enable.idempotence`), every record carries the
  source position of its Entries in the header `dts-bridge-pos`, and `resume(committed)` reads
  each output partition's tail back to the last commit, so the replay skips what already landed
  (and finishes a segmented Entries cut by a crash instead of starting it again).

The source position of an Entry is read off `where` (`source_of`): by default the key
`where["partition"]` and the order token `(where["offset"], where.get("entry", 0))`, as
`DtsAssembler` gives them; per source key these tokens rise in the order the Entries are written.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from bridge.kafka.client import KafkaError, confluent, partitions_of, retrying
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import encode_varint, envelope_values

__all__ = ["DtsKafkaSink", "transactional_id_for", "murmur2", "POSITION_HEADER", "CONTROL_PARTITION",
           "default_source_of"]

POSITION_HEADER = "dts-bridge-pos"
CONTROL_PARTITION = 0
_ENVELOPE_OVERHEAD = 24  # bridge.wire.framing's: tag + varint for version, total, index and data
_RECORD_HEADROOM = 64 * 1024  # librdkafka's message.max.bytes also counts the key and headers
_FENCED = {"PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED", "TRANSACTION_COORDINATOR_FENCED"}


def transactional_id_for(project: str, datahub_topic: str, kafka_topic: str) -> str:
    """The stable `transactional.id` of a DataHub -> Kafka pipeline: the same three names give the
    same id, so a restart (or a second copy started by mistake) fences the process before it."""
    return f"dts-bridge:{project}/{datahub_topic}->{kafka_topic}"


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (the Java client's default partitioner, librdkafka's `murmur2`), 31-bit positive."""
    length, seed, m, r = len(data), 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h & 0x7FFFFFFF


def default_source_of(where: dict) -> tuple[Any, tuple] | None:
    """(source key, order token) of an Entry's `where`, or None when it carries no position."""
    if not where or "partition" not in where or "offset" not in where:
        return None
    return where["partition"], (where["offset"], where.get("entry", 0))


def _key_bytes(data: pb.Data) -> bytes:
    return data.sv.encode("utf-8") if data.sv else bytes(data.bv)


class _Pending:
    """Entries packed for one partition, not yet produced."""
    __slots__ = ("items", "size", "marks")

    def __init__(self) -> None:
        self.items: list[bytes] = []
        self.size = 0
        self.marks: dict[str, list] = {}  # key text -> token of its last Entry here


class DtsKafkaSink:
    """A pipeline `Sink` writing DTS Envelopes to `topic`.

    `config`: librdkafka settings (`client_config(...)`); the sink adds `transactional.id` and
    `enable.idempotence`. `transactional_id`: required with `transactions=True` (derive it with
    `transactional_id_for`). `key_text(key)`: a source key as text (headers, offsets records).
    `source_of(where)`: (key, order token) of an Entry, see the module's doc. Call `close()` at
    the end (aborts a transaction left open: its records were never committed, their positions
    neither, so the next run writes them again)."""

    def __init__(self, config: dict, topic: str, *, transactional_id: str | None = None,
                 transactions: bool = True, partition_by: str = "table", max_message_bytes: int = 1_000_000,
                 key_text: Callable[[Any], str] = str,
                 source_of: Callable[[dict], tuple | None] = default_source_of,
                 transaction_timeout_ms: int | None = None, timeout: float = 30.0,
                 position_headers: bool = True) -> None:
        if partition_by not in ("table", "key"):
            raise ValueError(f"partition_by must be table or key, not {partition_by!r}")
        if max_message_bytes <= _ENVELOPE_OVERHEAD + 16:
            raise ValueError(f"max_message_bytes must exceed {_ENVELOPE_OVERHEAD + 16}")
        if transactions and not transactional_id:
            raise ValueError("a transactional sink needs a transactional_id (transactional_id_for(...))")
        self.config, self.topic = dict(config), topic
        self.transactions, self.transactional_id = transactions, transactional_id if transactions else None
        self.partition_by, self.max_message_bytes = partition_by, max_message_bytes
        self.key_text, self.source_of, self.timeout = key_text, source_of, timeout
        self._key_texts: dict = {}  # source key -> key_text(key), made once per key
        self.transaction_timeout_ms = transaction_timeout_ms
        self.position_headers = position_headers or not transactions  # the tail look needs them
        self.producer = None
        self.partitions: list[int] = []
        self._partition_of: dict = {}  # murmur2 text -> partition, for these partitions (a table's: few)
        self._pending: dict[int, _Pending] = {}
        self._failures: list = []
        self._fatal = None  # a fatal producer error error_cb heard (fenced)
        self._in_transaction = False
        # without transactions, from resume(): per (partition, key text) the last token that landed,
        # and per partition a segmented Entries the crash cut: (key text, token, total, next index)
        self.landed: dict[tuple[int, str], list] = {}
        self.cut: dict[int, tuple] = {}
        self.skipped = 0  # Entries the tail look found already written
        self.written = 0  # Entries handed to the producer
        self.committed = 0  # of them, Entries in committed transactions (what read_committed consumers see)
        self._uncommitted = 0  # Entries handed to the producer since the last commit
        self.per_partition: dict[int, int] = {}  # Entries handed to the producer, per output partition
        self.messages = 0  # Kafka records produced
        self.commits = 0  # transactions committed

    # ---- the producer ---------------------------------------------------------------------

    def start(self) -> DtsKafkaSink:
        """Create the producer (and, with transactions, `init_transactions()`: fences any older
        producer with this transactional id and aborts its open transaction). Idempotent."""
        if self.producer is not None:
            return self
        ck = confluent()
        conf = {"linger.ms": 5, **self.config, "enable.idempotence": True,
                "message.max.bytes": max(int(self.config.get("message.max.bytes", 0) or 0),
                                         self.max_message_bytes + _RECORD_HEADROOM)}
        user_error_cb = conf.get("error_cb")

        def heard(err) -> None:  # a fatal error (fenced) is also told here: kept for when flush loses it
            if getattr(err, "fatal", lambda: False)() or _is_fatal_code(err):
                self._fatal = err
            if user_error_cb is not None:
                user_error_cb(err)
        conf["error_cb"] = heard
        if self.transactions:
            conf["transactional.id"] = self.transactional_id
            if self.transaction_timeout_ms is not None:
                conf["transaction.timeout.ms"] = self.transaction_timeout_ms
        try:
            producer = ck.Producer(conf)
        except ck.KafkaException as exc:
            raise KafkaError(f"cannot create the Kafka producer: {exc.args[0]}") from None
        self.partitions = partitions_of(producer, self.topic, self.timeout)
        self._partition_of = {}
        if self.transactions:
            try:
                producer.init_transactions(self.timeout)
            except ck.KafkaException as exc:
                raise self._error(exc.args[0], "cannot initialise transactions") from None
        self.producer = producer
        return self

    def _error(self, err, what: str) -> KafkaError:
        name = err.name() if hasattr(err, "name") else ""
        text = err.str() if hasattr(err, "str") else str(err)
        if name in _FENCED or ((_is_fatal_code(err) or hasattr(err, "fatal") and err.fatal())
                               and "fenc" in text.lower()):
            return KafkaError(f"another process with transactional id {self.transactional_id!r} took over "
                              f"(this producer is fenced: {text}); nothing of its open transaction is "
                              f"committed, stop this process")
        return KafkaError(f"{what}: {text}")

    def _begin(self) -> None:
        if self.transactions and not self._in_transaction:
            try:
                self.producer.begin_transaction()
            except confluent().KafkaException as exc:
                raise self._error(exc.args[0], "cannot begin a transaction") from None
            self._in_transaction = True

    # ---- partitioning ---------------------------------------------------------------------

    def partition_for(self, entry: pb.Entry) -> int:
        """The partition `entry` goes to (see the module's doc)."""
        header = entry.header
        if not header.tableName:
            return CONTROL_PARTITION if CONTROL_PARTITION in self.partitions else self.partitions[0]
        text = f"{header.schemaName}.{header.tableName}".encode()
        if self.partition_by == "key":
            text = self._with_key(entry, text)
        cache = self._partition_of
        partition = cache.get(text)
        if partition is None:
            if len(cache) >= 4096:  # keys (`partition_by="key"`) are many: keep it small
                cache.clear()
            partition = cache[text] = self.partitions[murmur2(text) % len(self.partitions)]
        return partition

    @staticmethod
    def _with_key(entry: pb.Entry, table: bytes) -> bytes:
        dml = entry.event.dmlEvent
        keys = [i for i, col in enumerate(dml.columns) if col.isKey]
        if not keys or not dml.rows:
            return table
        row = dml.rows[0]
        image = row.oldColumns if len(row.oldColumns) else row.newColumns
        return table + b"\x00" + b"\x00".join(_key_bytes(image[i]) if i < len(image) else b"" for i in keys)

    # ---- the Sink protocol ----------------------------------------------------------------

    def write(self, where: dict, entry) -> None:
        """One whole Entry (or a list of them) at `where`, in source order."""
        if entry is None:  # an Entry the error policy kept as an error
            return
        if isinstance(entry, (list, tuple)):
            for one in entry:
                self.write(where, one)
            return
        if self.producer is None:
            self.start()
        partition = self.partition_for(entry)
        source = self.source_of(where)
        mark = None
        if source is not None:
            texts = self._key_texts
            text = texts.get(source[0])
            if text is None:
                if len(texts) >= 4096:
                    texts.clear()
                text = texts[source[0]] = self.key_text(source[0])
            mark = (text, list(source[1]))
            if self.landed or self.cut:
                if self._landed(partition, mark):
                    self.skipped += 1
                    return
        raw = entry.SerializeToString()
        item = b"\x0a" + encode_varint(len(raw)) + raw  # Entries.items, field 1
        budget = self.max_message_bytes - _ENVELOPE_OVERHEAD
        pending = self._pending.get(partition)
        if pending is not None and pending.items and pending.size + len(item) > budget:
            self._emit(partition)
            pending = None
        if pending is None:
            pending = self._pending[partition] = _Pending()
        pending.items.append(item)
        pending.size += len(item)
        if mark is not None:
            pending.marks[mark[0]] = mark[1]
        self.written += 1
        self._uncommitted += 1
        self.per_partition[partition] = self.per_partition.get(partition, 0) + 1
        if pending.size > budget:  # one Entry too large for a message: its own segments, now
            self._emit(partition)

    def _landed(self, partition: int, mark: tuple) -> bool:
        cut = self.cut.get(partition)
        if cut is not None and cut[0] == mark[0] and cut[1] == mark[1]:
            return False  # written below, from the segment the crash stopped at
        last = self.landed.get((partition, mark[0]))
        return last is not None and mark[1] <= last

    def _emit(self, partition: int) -> None:
        pending = self._pending.pop(partition, None)
        if pending is None or not pending.items:
            return
        self._begin()
        envelopes = envelope_values(pending.items, self.max_message_bytes)  # each Envelope encoded
        headers = None
        if self.position_headers and pending.marks:
            headers = [(POSITION_HEADER, json.dumps(pending.marks, separators=(",", ":")).encode())]
        first = 0
        cut = self.cut.pop(partition, None)
        if cut is not None and len(pending.items) == 1 and cut[0] in pending.marks \
                and pending.marks[cut[0]] == cut[1]:
            if cut[2] != len(envelopes):
                raise KafkaError(f"partition {partition} of {self.topic} ends with segment {cut[3] - 1} of "
                                 f"{cut[2]} of an Entries this run cuts into {len(envelopes)} segments "
                                 f"(max_message_bytes changed across the crash?)")
            first = cut[3]
        elif cut is not None:
            self.cut[partition] = cut
        for value in envelopes[first:]:
            self._produce(partition, value, headers)

    def _produce(self, partition: int, value: bytes, headers) -> None:
        ck = confluent()
        while True:
            try:
                self.producer.produce(self.topic, value=value, partition=partition, headers=headers,
                                      on_delivery=self._delivered)
                self.messages += 1
                self.producer.poll(0)  # serve delivery reports as we go
                return
            except BufferError:
                self._flushed(0.1)
            except (ck.KafkaException, SystemError) as exc:
                err = _kafka_error(exc) or self._heard_fatal()
                if err is None:
                    raise
                raise self._error(err, f"cannot send to {self.topic} [{partition}]") from None

    def _flushed(self, timeout: float) -> int:
        """producer.flush; a fatal error (fenced) raised from inside a delivery callback comes out
        of confluent-kafka as a SystemError around the KafkaException."""
        ck = confluent()
        try:
            return self.producer.flush(timeout)
        except (ck.KafkaException, SystemError) as exc:
            # confluent-kafka sometimes loses the exception raised in a callback ("returned NULL
            # without setting an exception"): the fatal error error_cb heard is the one
            err = _kafka_error(exc) or self._heard_fatal()
            if err is None:
                raise
            raise self._error(err, f"records to {self.topic} were not delivered") from None

    def _heard_fatal(self, wait: float = 2.0):
        """The fatal error error_cb heard; when confluent-kafka lost the exception of a failed call
        before error_cb was served (seen under load: flush's SystemError came first), the
        producer's callbacks are served for up to `wait` seconds until it is."""
        deadline = time.monotonic() + wait
        while self._fatal is None and time.monotonic() < deadline:
            try:
                self.producer.poll(0.1)
            except Exception as exc:  # noqa: BLE001 - a fenced producer may raise here too: error_cb still runs
                err = _kafka_error(exc)
                if err is not None and (err.fatal() or _is_fatal_code(err)):
                    self._fatal = err
            if self._fatal is None:  # a delivery report may be the only one to tell it (seen under load)
                self._fatal = next((err for err, _ in self._failures if err.name() in _FENCED), None)
        return self._fatal

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self._failures.append((err, msg.partition()))

    def flush(self) -> None:
        """Everything written so far produced and acknowledged by the broker (in a transaction:
        written, not yet visible to read_committed consumers: `commit`)."""
        if self.producer is None:
            return
        for partition in list(self._pending):
            self._emit(partition)
        deadline = time.monotonic() + self.timeout
        while self._flushed(min(1.0, self.timeout)) > 0:
            if time.monotonic() > deadline:
                raise KafkaError(f"records to {self.topic} not acknowledged within {self.timeout:g} s")
        if self._failures:
            err, partition = self._failures[0]
            self._failures.clear()
            raise self._error(err, f"a record to {self.topic} [{partition}] was not delivered")

    # ---- transactions ---------------------------------------------------------------------

    def commit(self, records: list[tuple[str, bytes, bytes]] = ()) -> None:
        """Produce `records` ((topic, key, value): the source positions) and commit everything
        written since the last commit with them, in one transaction. Without transactions the
        records are produced and flushed (the plain store's save)."""
        if self.producer is None:
            self.start()
        self.flush()
        if not records and not self._in_transaction:
            return
        self._begin()
        for topic, key, value in records:
            while True:
                try:
                    self.producer.produce(topic, value=value, key=key, on_delivery=self._delivered)
                    break
                except BufferError:
                    self.producer.poll(0.1)
                except confluent().KafkaException as exc:
                    raise self._error(exc.args[0], f"cannot write the positions to {topic}") from None
        if not self.transactions:
            self.flush()
            self.committed += self._uncommitted
            self._uncommitted = 0
            return
        ck = confluent()
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self.producer.commit_transaction(self.timeout)
                break
            except (ck.KafkaException, SystemError) as exc:
                err = _kafka_error(exc)
                if err is None:
                    raise
                if err.retriable() and not err.fatal() and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                if err.txn_requires_abort():
                    self.abort()
                raise self._error(err, "the transaction could not be committed (aborted: the next run "
                                  "writes its records again)") from None
        self._in_transaction = False
        self.commits += 1
        self.committed += self._uncommitted
        self._uncommitted = 0
        if self._failures:  # delivered within a committed transaction cannot fail; be loud if it did
            err, partition = self._failures[0]
            self._failures.clear()
            raise self._error(err, f"a record to {self.topic} [{partition}] failed")

    def abort(self) -> None:
        """Drop what is pending and abort the open transaction (its records never become visible)."""
        self._pending.clear()
        self._failures.clear()
        self._uncommitted = 0  # never visible
        if self.producer is None or not self._in_transaction:
            return
        self._in_transaction = False
        try:
            self.producer.abort_transaction(self.timeout)
        except confluent().KafkaException as exc:
            raise self._error(exc.args[0], "cannot abort the transaction") from None

    def close(self) -> None:
        """Abort a transaction left open (without transactions: flush), let the producer go."""
        if self.producer is None:
            return
        try:
            if self.transactions:
                try:
                    self.abort()
                except KafkaError:
                    pass  # fenced or gone: the coordinator aborts it (timeout or the next init)
            else:
                self.flush()
        finally:
            self.producer = None

    # ---- without transactions: the tail look ----------------------------------------------

    def resume(self, committed: dict, consumer_config: dict | None = None, chunk: int = 500) -> dict:
        """Read each output partition back from its end to the last commit (the first record whose
        source position lies below the committed one of its key, else the partition's start) and
        remember per (partition, key text) the last position that landed: `write` then skips the
        Entries at or below it. `committed`: {key: position or (position, read)}. Returns the
        landed marks."""
        if self.producer is None:
            self.start()
        floor = {}
        for key, value in committed.items():
            position = value[0] if isinstance(value, tuple) else value
            if position is not None:
                floor[self.key_text(key)] = position
        ck = confluent()
        conf = {k: v for k, v in self.config.items() if not k.startswith(("linger", "acks", "batch", "compression",
                                                                          "message.", "queue.", "enable.idem",
                                                                          "transaction", "retries"))}
        consumer = ck.Consumer({**conf, **(consumer_config or {}), "group.id": "dts-bridge-tail-look",
                                "enable.auto.commit": False, "enable.partition.eof": True,
                                "isolation.level": "read_committed"})
        try:
            for partition in self.partitions:
                self._look_back(consumer, partition, floor, chunk)
        finally:
            consumer.close()
        return dict(self.landed)

    def _look_back(self, consumer, partition: int, floor: dict, chunk: int) -> None:
        ck = confluent()
        tp = ck.TopicPartition(self.topic, partition)
        low, high = retrying(lambda: consumer.get_watermark_offsets(tp, timeout=self.timeout, cached=False),
                             f"the watermarks of {self.topic} partition {partition}", self.timeout)
        end, first = high, True
        while end > low:
            start = max(low, end - chunk)
            records = _read_range(consumer, self.topic, partition, start, end, self.timeout)
            for offset, value, headers in reversed(records):
                marks = _marks(headers)
                if marks is None:
                    continue
                if first:  # the partition's last record: a segmented Entries the crash cut?
                    first = False
                    env = pb.Envelope.FromString(value)
                    if env.total > 1 and env.index < env.total - 1 and len(marks) == 1:
                        key, token = next(iter(marks.items()))
                        self.cut[partition] = (key, token, env.total, env.index + 1)
                        continue
                if any(key in floor and token[0] < floor[key] for key, token in marks.items()):
                    return  # written before the last commit, and so is everything before it
                env = pb.Envelope.FromString(value)
                if env.index != env.total - 1:
                    continue  # a segment before the last: the last one counts
                for key, token in marks.items():
                    last = self.landed.get((partition, key))
                    if last is None or token > last:
                        self.landed[(partition, key)] = token
            end = start


def _is_fatal_code(err) -> bool:
    """error_cb tells a fatal error as librdkafka's _FATAL, whose own fatal() need not say so."""
    return getattr(err, "name", lambda: "")() == "_FATAL"


def _kafka_error(exc: BaseException):
    """The librdkafka error of a KafkaException, also when confluent-kafka raised it from inside a
    callback (a SystemError whose cause is the KafkaException); None if there is none."""
    ck = confluent()
    while exc is not None and not isinstance(exc, ck.KafkaException):
        exc = exc.__cause__ or exc.__context__
    return exc.args[0] if exc is not None else None


def _marks(headers) -> dict | None:
    for key, value in headers or ():
        if key == POSITION_HEADER and value is not None:
            try:
                marks = json.loads(value)
            except ValueError:
                return None
            return marks if isinstance(marks, dict) else None
    return None


def _read_range(consumer, topic: str, partition: int, start: int, end: int, timeout: float) -> list:
    """The records of [start, end) of one partition as (offset, value, headers)."""
    ck = confluent()
    consumer.assign([ck.TopicPartition(topic, partition, start)])
    out: list = []
    deadline = time.monotonic() + timeout
    while True:
        msgs = consumer.consume(num_messages=500, timeout=0.5)
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == ck.KafkaError._PARTITION_EOF:
                    return out
                raise KafkaError(f"cannot read back {topic} [{partition}]: {err.str()}")
            if msg.offset() >= end:
                return out
            out.append((msg.offset(), msg.value(), msg.headers()))
            if msg.offset() >= end - 1:
                return out
        if time.monotonic() > deadline:
            raise KafkaError(f"reading back {topic} [{partition}] from {start} to {end} took over {timeout:g} s")
