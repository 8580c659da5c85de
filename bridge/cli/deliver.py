"""`dts-bridge deliver`: Blob / Tuple JSON Lines -> DataHub, resumable from a state file. Thin,
like bridge.cli.main: one file through the pipeline loop (`bridge.pipeline.run`: `FileLines` ->
`LineRecords` -> the DataHub writer, the state file as its positions), the work in
bridge.stream.files and bridge.datahub, the error policy and the accounting in bridge.stream.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
from collections.abc import Callable

import orjson

from bridge.blob.encode import shard_key
from bridge.cli import observe
from bridge.cli.base import (
    PROG,
    UsageError,
    _describe,
    _epilog,
    _Formatter,
    _one_line,
    add_pipeline_flags,
    pipeline_options_from,
    rejects_sink,
    resolve_format,
)
from bridge.cli.kafka import _add_watch_flags, _watching
from bridge.cli.tuple import SCHEMA_SUFFIX, _tuple_module, schema_path
from bridge.errors import BridgeError, DecodeError
from bridge.stream import ErrorPolicy, Tally

__all__ = ["register", "cmd_deliver", "DELIVER_STATE_SUFFIX"]


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


DELIVER_STATE_SUFFIX = ".deliver-state.json"
_HEAD_BYTES = 65536  # the input's first bytes, hashed: a file replaced by another is not resumed


def _input_identity(path: str, head_bytes: int = _HEAD_BYTES) -> dict:
    """Path, size, mtime and a hash of the first `head_bytes` (all of a smaller file): a file that
    grew keeps its identity, one replaced by another does not."""
    st = os.stat(path)
    with open(path, "rb") as fh:
        head = fh.read(head_bytes)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "head_bytes": len(head), "head_sha256": hashlib.sha256(head).hexdigest()}


class _DeliverState:
    """deliver's `Positions`: the state file, with the input's identity and the line (and byte
    offset) after which every record is acknowledged by DataHub, written atomically at each
    commit of the loop (after an acknowledged batch), with the counts and the rejects' length
    at that line. Key 0, position = the next line to read."""

    def __init__(self, path: str, input_path: str, target: dict) -> None:
        self.path, self.input_path, self.target = path, input_path, target
        self.line = self.offset = self.delivered = self.rejected = self.rejects_length = 0
        # set by follow(): where a commit's line ends in the file, the run's tally, the rejects file
        self._place: Callable[[int], tuple[int, int]] | None = None
        self._tally: Tally | None = None
        self._rejects = None
        self._counted = (0, 0)

    def restore(self) -> bool:
        """Resume from the state file, if there is one for this input and target; True if so."""
        try:
            with open(self.path, "rb") as fh:
                doc = orjson.loads(fh.read())
        except FileNotFoundError:
            return False
        except (OSError, orjson.JSONDecodeError) as err:
            raise UsageError(f"cannot read the state file {self.path}: {_one_line(err)} (pass --restart to "
                             "deliver from the first line)") from None
        then = doc.get("input", {})
        now = _input_identity(self.input_path, int(then.get("head_bytes", _HEAD_BYTES)))
        offset = int(doc.get("offset", 0))
        changed = (then.get("path") != now["path"] or then.get("head_sha256") != now["head_sha256"]
                   or now["size"] < max(offset, int(then.get("size", 0))))  # grown is fine, shrunk is not
        if changed:
            raise UsageError(f"{self.input_path} is not the file {self.path} was written for (size, first bytes or "
                             "name differ): pass --restart to deliver it from the first line")
        if {k: doc.get(k) for k in self.target} != self.target:
            raise UsageError(f"{self.path} is for {doc.get('project')}/{doc.get('topic')}, not "
                             f"{self.target['project']}/{self.target['topic']}: pass --restart or another --state")
        self.line, self.offset = int(doc.get("line", 0)), offset
        self.delivered, self.rejected = int(doc.get("delivered", 0)), int(doc.get("rejected", 0))
        self.rejects_length = int(doc.get("rejects_length", 0))
        return True

    def follow(self, place: Callable[[int], tuple[int, int]], tally: Tally, rejects) -> None:
        self._place, self._tally, self._rejects = place, tally, rejects
        self._counted = (self.delivered, self.rejected)

    def load(self, keys: list) -> dict:
        return {0: (self.line + 1, self.line + 1)}

    def save(self, commit: dict, read: dict) -> None:
        """The loop commits only where everything read is acknowledged (the sink's watermark moves
        at its batches), so the run's tally and the rejects file stand exactly for the lines
        before the commit. A commit that reaches no further than the file says is not written."""
        line, offset = self._place(commit[0])
        if (line, offset) == (self.line, self.offset):
            return
        if self._rejects is not None:
            self._rejects.flush()
            os.fsync(self._rejects.fileno())
            self.rejects_length = self._rejects.tell()
        self.line, self.offset = line, offset
        self.delivered = self._counted[0] + self._tally.converted
        self.rejected = self._counted[1] + self._tally.rejected
        self._write()

    def _write(self) -> None:
        from bridge.stream.state import replace_json
        doc = {"input": _input_identity(self.input_path), **self.target, "line": self.line, "offset": self.offset,
               "delivered": self.delivered, "rejected": self.rejected, "rejects_length": self.rejects_length}
        try:
            replace_json(self.path, doc)
        except OSError as err:
            raise UsageError(f"cannot write the state file {self.path}: {err.strerror}") from None


def _open_rejects(path: str, length: int):
    """The rejects file, cut back to what the state vouches for (a resumed run appends)."""
    try:
        fh = open(path, "ab")
        fh.truncate(length)
        return fh
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}") from None


def _json_line(line: bytes, number: int):
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as err:
        raise DecodeError(f"invalid JSON ({err.msg})", value=line, line=number) from None


def _blob_records(line: bytes, number: int) -> tuple:
    """A Blob line -> (the BlobRecord's data, its shard key, the line)."""
    return line.rstrip(b"\r\n"), shard_key(_json_line(line, number)), line


def _tuple_records(tup, fields: list, table: str, keys: list) -> Callable[[bytes, int], tuple]:
    """A Tuple line -> (the row typed by the RecordSchema, its shard key, the line)."""
    from bridge.datahub.sink import tuple_shard_key

    def parse(line: bytes, number: int) -> tuple:
        row = tup.coerce_row(_json_line(line, number), fields, line=number)
        return row, tuple_shard_key(row, table, keys), line
    return parse


class _EntryLines:
    """Which lines of the file make one Entry, as the reverse reader will group them. The reader
    (bridge/stream/shards.py `stream_of`) takes records whose `dts.pos` share partition:offset:entry
    for the rows of one Entry and finishes its decoder's open Entry (rejecting what is incomplete)
    when the group changes; so deliver runs the same decoder over the lines it sends and keeps one
    group while that decoder holds something open (an UPDATE's first half, an event's rows still to
    come), as `convert` groups one file. A line's position is then (0, first line of its Entry, 0,
    line - first line): per partition in increasing order, as the writer's restart look needs.
    `feed(value, number)` feeds the decoder and answers whether it holds an open Entry after it."""

    def __init__(self, feed: Callable) -> None:
        self.feed = feed
        self.first: int | None = None  # the first line of the open Entry (None: none is open)

    def place(self, number: int) -> tuple[int, int]:
        """(offset, row) of line `number`'s record."""
        first = number if self.first is None else self.first
        return first, number - first

    def fed(self, value, number: int) -> None:
        first = number if self.first is None else self.first
        self.first = first if self.feed(value, number) else None

    @property
    def open(self) -> bool:
        return self.first is not None

    @staticmethod
    def of_blob() -> _EntryLines:
        from bridge.blob.decode import BlobDecoder
        decoder = BlobDecoder()

        def feed(line: bytes, number: int) -> bool:
            try:
                decoder.feed_line(line, line=number)
            except BridgeError:
                pass  # the reader rejects that line too, and holds what the decoder holds
            if decoder.evicted:  # halves pushed out of the pairing window: the reader reports them
                decoder.evicted.clear()
            return bool(decoder.pending)
        return _EntryLines(feed)

    @staticmethod
    def of_tuple(schema: dict, table: str) -> _EntryLines:
        from bridge.tuple.decode import TupleDecoder
        decoder = TupleDecoder(schema, table=table or None)

        def feed(row: dict, number: int) -> bool:
            try:
                decoder.feed(row, number=number)
            except BridgeError:
                pass
            if decoder.evicted:
                decoder.evicted.clear()
            return bool(decoder.pending)
        return _EntryLines(feed)


class _DeliverSink:
    """deliver's `Sink`: each line's record goes to the DataHub writer with its position (the
    file, key 0, the first line of its Entry, 0, its row in the Entry: `_EntryLines`), and every
    `batch` records, at the next line that ends an Entry, the sink waits for DataHub to acknowledge
    them. Its watermark (`acknowledged`) is the line after the last batch it waited for, so the
    loop commits there, at an Entry's end: a rerun starts at an Entry's first line, and gives its
    lines the positions the killed run gave them (the restart look recognises what landed). A
    record the writer refuses to build (over DataHub's limits, a value the topic cannot hold) was
    counted converted: it is rejected instead, the line to the rejects."""

    def __init__(self, out, source: str, name: str, batch: int, policy: ErrorPolicy, start: int,
                 entries: _EntryLines) -> None:
        from bridge.datahub.sink import DataHubError, Position
        self.fatal, self.position = DataHubError, Position
        self.out, self.writer, self.source, self.name = out, out.writer, source, name
        self.batch, self.policy, self.entries = batch, policy, entries
        self.unflushed = 0
        self.written_to = self.acked = start  # the line after the last written, after the last acknowledged

    def write(self, where: dict, item: tuple) -> None:
        value, key, line = item
        number = where["line"]
        offset, row = self.entries.place(number)
        try:
            pending = self.writer.prepare(self.out.topic, key, value, self.position(self.source, 0, offset, 0, row))
        except BridgeError as err:
            if isinstance(err, self.fatal):
                raise  # the service, not this record: no later record would fare better
            # it was counted converted: now rejected, counted before the rejects line is written
            # (its `records` is the count's change)
            self.policy.tally.withdrew(1)
            self.policy.tally.undelivered()
            self.policy.reject(err.located(line=number, source=self.name), line, count=0)
            return
        if pending is not None:  # None: it landed before a restart (found in the shard's tail)
            self.writer.put_prepared(pending)
        self.entries.fed(value, number)  # sent (or found landed): the reader's decoder will see it
        self.written_to = number + 1
        self.unflushed += 1
        if self.unflushed >= self.batch and not self.entries.open:
            self.flush()

    def flush(self) -> None:
        self.writer.flush()  # returns once DataHub accepted every record put so far
        self.unflushed = 0
        self.acked = self.written_to

    def acknowledged(self) -> dict:
        return {0: self.acked}


def cmd_deliver(args: argparse.Namespace) -> int:
    from bridge import pipeline
    from bridge.datahub.sink import DataHubSink
    from bridge.stream.files import FileLines, LineRecords
    side, framing = resolve_format(args.input, args.from_, "--from")
    if side not in ("blob", "tuple") or framing != "jsonl":
        raise UsageError("deliver reads Blob JSON Lines, or Tuple JSON Lines with --from tuple")
    if args.rejects and args.on_error != "skip":
        raise UsageError("--rejects needs --on-error skip (under fail the first bad record stops the run)")
    popts = pipeline_options_from(args)
    if not os.path.isfile(args.input):
        raise UsageError(f"cannot read {args.input}: no such file")
    tally = Tally()
    label = f"{PROG} deliver {args.input}"
    state = _DeliverState(args.state or args.input + DELIVER_STATE_SUFFIX, args.input,
                          {"project": args.project, "topic": args.topic})
    resumed = False if args.restart else state.restore()
    rejects_fh = _open_rejects(args.rejects, state.rejects_length if resumed else 0) if args.rejects else None
    schema = None
    parse = _blob_records
    if side == "tuple":
        tup = _tuple_module()
        schema, keys, table = _tuple_source(args, tup)
        parse = _tuple_records(tup, [(f["name"], f["type"]) for f in tup.load_record_schema(schema)["fields"]],
                               table, keys)
        entries = _EntryLines.of_tuple(schema, table)
    else:
        entries = _EntryLines.of_blob()
    bar = observe.progress(total=os.path.getsize(args.input), unit="B", unit_scale=True, desc=label,
                           enabled=False if args.no_progress else None,
                           describe=lambda: f"{tally.converted:,} records")
    out = None
    metrics = observe.Metrics()
    seen = [0.0, 0.0]  # write requests and their seconds at the last status line

    def refresh(metrics: observe.Metrics) -> None:
        metrics.count_tally(tally)
        if out is not None:
            metrics.count_to(metrics.datahub_retries, out.retries)

    def write_requests(name: str) -> float:
        return sum(metrics.value(name, request=op) or 0 for op in ("PutRecords", "PutRecordsByShard"))

    def render(status: observe.StatusLine) -> str:
        sent = tally.converted
        count = write_requests("datahub_request_seconds_count")
        total = write_requests("datahub_request_seconds_sum")
        latency = (total - seen[1]) / (count - seen[0]) if count > seen[0] else None  # since the last line
        seen[:] = [count, total]
        throttles = write_requests("datahub_throttles_total")
        text = (f"{sent:,} records sent ({observe.rate_text(status.rate('out', sent))}), acknowledged to line "
                f"{state.line:,}, {tally.rejected:,} rejected, "
                f"{int(count):,} requests, {out.retries if out else 0:,} retries, {int(throttles):,} throttled")
        return text + (f", latency {latency * 1000:.0f} ms" if latency is not None else "")

    base_line = state.line
    # the parts of the one loop: the file's lines (from the state's line and byte offset), a record
    # per line under the error policy, the DataHub writer, the state file
    lines = FileLines(args.input, start=(state.line, state.offset))
    with contextlib.ExitStack() as stack:
        stack.callback(bar.close)
        if rejects_fh is not None:
            stack.callback(rejects_fh.close)
        stack.callback(lines.close)
        policy = ErrorPolicy(args.on_error, tally=tally, sink=rejects_sink(rejects_fh, tally), keep_records=False)
        stack.enter_context(_watching(args, label, metrics, render, refresh))
        out = DataHubSink(args.datahub_endpoint, args.project, args.topic, record_schema=schema,
                          batch_size=popts.batch_size, max_retries=popts.max_retries, compress=popts.compress)
        out.writer.client = metrics.timed_datahub_client(out.writer.client)  # counted and timed
        # Lines past the state's acknowledged line that landed before a kill are found by their
        # position attributes (source = the file, offset = the first line of their Entry, which
        # the state's line never lies inside) and not sent twice.
        source = "file:" + os.path.abspath(args.input)
        out.writer.resume(source, {0: base_line + 1})
        state.follow(lines.place, tally, rejects_fh)
        sink = _DeliverSink(out, source, args.input, popts.batch_size, policy, base_line + 1, entries)
        bar.update(state.offset)
        bar.follow(lambda: lines.offset)
        # commit_interval=0: the loop offers a commit before every line; the sink's watermark moves
        # only at its batches, so the state is saved every --batch-size records and at the end
        pipeline.run(lines, state, LineRecords(parse, source=args.input), lambda record: [record], sink, policy,
                     idle_timeout=0, commit_interval=0)
        out.close()
    resume_note = f" (resumed after line {base_line:,})" if resumed else ""
    print(f"{label}: delivered {tally.converted} of {tally.input} records to {args.project}/{args.topic} "
          f"in {out.requests} requests ({out.retries} retries); rejected {tally.rejected}{resume_note}",
          file=sys.stderr)
    return 1 if tally.rejected else 0


def register(commands) -> None:
    """Add deliver to `dts-bridge`'s subcommands (called by bridge.cli.main)."""
    deliver = commands.add_parser(
        "deliver", formatter_class=_Formatter, help="write Blob or Tuple JSON Lines to a DataHub topic",
        description=_describe(
            "Write a Blob JSON Lines file as BlobRecords, or a Tuple JSON Lines file (--from tuple, with its "
            f"NAME{SCHEMA_SUFFIX}) as TupleRecords, with PutRecords in batches. Records go to shards by the "
            "DataWorks rule (primary-key values, else the table name, hashed over the ACTIVE shards); transient "
            "failures are retried with exponential backoff. After every acknowledged batch the line reached is "
            f"saved in a state file (FILE{DELIVER_STATE_SUFFIX}); a rerun resumes after it (--restart: from the "
            "first line). Credentials: $DATAHUB_ACCESS_ID, $DATAHUB_ACCESS_KEY."),
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
    add_pipeline_flags(deliver, ("batch_size", "max_retries", "compress"))
    deliver.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                         help="a record DataHub or the RecordSchema refuses: stop (exit 1) or skip and count it")
    deliver.add_argument("--rejects", metavar="PATH", help="with --on-error skip: one JSON line per rejected record")
    deliver.add_argument("--state", metavar="PATH",
                         help=f"where the line reached is kept (default: FILE{DELIVER_STATE_SUFFIX})")
    deliver.add_argument("--restart", action="store_true", help="ignore the state file: deliver from the first line")
    _add_watch_flags(deliver, kafka=False)
    deliver.set_defaults(run=cmd_deliver)
