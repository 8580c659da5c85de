"""Streams of records through the converters, with the error policy applied in one place.

Every face (the CLI, the Spark transforms, the Kafka consumer) reads records, converts them and
writes results through these functions, so the accounting law holds everywhere:
`converted + rejected + not_emitted == input`, counted in input records. A record is an Entry for
DTS input (plus one per Envelope that framing rejects before it could become part of an Entry),
a message for Blob input and a row for Tuple input.

>>> tally = Tally()
>>> policy = ErrorPolicy("skip", tally=tally)
>>> list(blob_lines_to_entries([b'{"bad json'], policy))
[]
>>> (tally.input, tally.rejected, policy.rejects[0]["reason"][:12])
(1, 1, 'invalid JSON')
"""
from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bridge.blob.decode import BlobDecoder
from bridge.errors import BridgeError, LineTooLongError
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.values import SUBSTITUTION_NOTES, SUBSTITUTIONS, Decoder
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import Assembled, Reassembler, Redelivered, ResumedTail, entry_from_json_line

__all__ = ["Tally", "ErrorPolicy", "ledger_record", "counted", "dts_records_to_entries", "dts_json_lines_to_entries",
           "assembled_entries", "entries_to_outputs", "entries_to_messages", "blob_lines_to_entries", "tuple_rows_to_entries",
           "decoder_entries", "reject_record"]


@dataclass
class Tally:
    """Counts in input records; `input == converted + rejected + not_emitted` once a run ends."""
    input: int = 0
    converted: int = 0
    rejected: int = 0
    not_emitted: int = 0
    outputs: int = 0
    envelopes: int = 0
    redelivered: int = 0  # TDSQL records Kafka delivered again (ps not above the last): dropped
    resumed_tails: int = 0  # TDSQL segments of Entries handed out before the commit a run resumed at
    duplicates: int = 0  # DataHub records written twice (a writer's retry): the copy dropped, not input
    # values a temporal policy substituted in converted records (values.SUBSTITUTIONS; the loss ledger
    # holds each one): zero or invalid dates written as null, fractional seconds cut to milliseconds,
    # dates beyond DataHub's TIMESTAMP range written as null (Tuple)
    zero_dates: int = 0
    fractions: int = 0
    out_of_range: int = 0

    def balanced(self) -> bool:
        return self.input == self.converted + self.rejected + self.not_emitted

    # The moves a pipeline makes after a record was counted, kept here so that every face counts
    # them alike (sinks, replay, deliver): the law above holds after each.
    def took(self, outputs: int) -> None:
        """One input record converted into `outputs` outputs (none: not emitted)."""
        self.input += 1
        if outputs:
            self.converted += 1
            self.outputs += outputs
        else:
            self.not_emitted += 1

    def withdrew(self, outputs: int) -> None:
        """Outputs counted that did not go out (their record is counted by `undelivered`)."""
        self.outputs -= outputs

    def undelivered(self) -> None:
        """A record counted converted whose outputs did not go out (refused, dead-lettered)."""
        self.converted -= 1
        self.rejected += 1

    def summary(self, wrote: str = "") -> str:
        """The run's one-line report; `wrote` says where the output went (after its count)."""
        again = f"; dropped {self.redelivered} redelivered Envelopes" if self.redelivered else ""
        if self.duplicates:
            again += f"; dropped {self.duplicates} duplicate DataHub records"
        changed = "".join(f"; {getattr(self, kind)} {what}" for kind, what in SUBSTITUTIONS.items()
                          if getattr(self, kind))
        return (f"converted {self.converted}, rejected {self.rejected}, not emitted {self.not_emitted} "
                f"(of {self.input} input records); wrote {self.outputs}{wrote}{again}{changed}")


def reject_record(err: BridgeError, raw: Any = None) -> dict:
    """A rejects-file line: where, why, and the raw input shortened (base64 when binary)."""
    out = err.to_dict()
    length = None
    if isinstance(raw, LineTooLongError):  # a line never held whole: its first bytes
        raw, length = raw.head, raw.length
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw)
        length = len(raw) if length is None else length
        out["raw_base64"] = base64.b64encode(raw[:4096]).decode("ascii")
        if length > 4096:
            out["raw_truncated_from"] = length
    elif isinstance(raw, str):
        out["raw"] = raw[:4096]
    elif raw is not None:
        out["raw"] = repr(raw)[:4096]
    return out


def ledger_record(where: dict, kind: str, column: str, value: str, written: Any) -> dict:
    """A loss-ledger line: where (as a rejects record says it), the column, what was sent and
    what was written in its place."""
    return {**where, "column": column, "kind": kind, "value": value, "written": written}


@dataclass
class ErrorPolicy:
    """fail: raise the first error; skip: count it and keep a rejects record; keep: like skip, and
    the caller also emits a row carrying the error (Spark's PERMISSIVE).

    The loss ledger: every value a temporal policy substituted in a converted record is counted in
    the tally (by kind) and, with `ledger`, handed to it as a `ledger_record`."""
    on_error: str = "fail"
    tally: Tally = field(default_factory=Tally)
    sink: Callable[[dict], None] | None = None
    rejects: list = field(default_factory=list)
    keep_records: bool = True
    # An Entry's error also names its index in its Entries message (`entry N`, last; a producer may
    # repeat a seqId). Off by default: Spark puts `entry` in a column of its own and its error texts
    # stay as they were; the CLI's convert and consume turn it on.
    name_entry: bool = False
    ledger: Callable[[dict], None] | None = None

    def substituted(self, notes: list, where: dict) -> None:
        """Count (and hand to the ledger) the substitutions of one converted record."""
        tally = self.tally
        for kind, column, value, written in notes:
            setattr(tally, kind, getattr(tally, kind) + 1)
            if self.ledger is not None:
                self.ledger(ledger_record(where, kind, column, value, written))

    def __post_init__(self) -> None:
        if self.on_error not in ("fail", "skip", "keep"):
            raise ValueError(f"on_error must be fail, skip or keep, not {self.on_error!r}")

    def reject_input(self, err: BridgeError, raw: Any = None) -> dict:
        """A record rejected before it could be converted, counted as input here."""
        self.tally.input += 1
        return self.reject(err, raw)

    def reject(self, err: BridgeError, raw: Any = None, count: int = 1) -> dict:
        if self.on_error == "fail":
            raise err
        record = reject_record(err, raw)
        self.tally.rejected += count
        if self.sink is not None:
            self.sink(record)
        elif self.keep_records:
            self.rejects.append(record)
        return record


def dts_records_to_assembled(records: Iterable[tuple], policy: ErrorPolicy,
                             reassembler: Reassembler | None = None, finish: bool = True) -> Iterator[Assembled]:
    """(partition, offset, Envelope bytes[, Kafka headers]) in offset order per partition -> each
    complete Entries (`Assembled`), its Entries not yet counted as input. Framing errors go to the
    policy, counted in the Envelopes they dispose of; TDSQL redeliveries are counted and dropped."""
    reassembler = reassembler or Reassembler()
    tally = policy.tally
    for record in records:
        partition, offset, value = record[0], record[1], record[2]
        tally.envelopes += 1
        for item in reassembler.feed(partition, offset, value, record[3] if len(record) > 3 else None):
            if isinstance(item, Assembled):
                yield item
            elif isinstance(item, Redelivered):
                tally.redelivered += 1
            elif isinstance(item, ResumedTail):
                tally.resumed_tails += 1
            else:
                tally.input += item.count
                own = item.count == 1 and "last_ps" not in item.where  # a ps gap's count is the lost records
                policy.reject(item, value if own else None, item.count)
    if finish:
        for item in reassembler.finish():
            if isinstance(item, Assembled):
                yield item
                continue
            tally.input += item.count
            policy.reject(item, None, item.count)


def dts_records_to_entries(records: Iterable[tuple[Any, int, bytes]], policy: ErrorPolicy,
                           reassembler: Reassembler | None = None, finish: bool = True, raw: bool = False
                           ) -> Iterator[tuple]:
    """(partition, offset, Envelope bytes) in offset order per partition -> (where, Entry).

    With `raw`, (where, Entry, the Entry's bytes or None): the C fast path of a converter reads
    the row images off those bytes (`BlobEncoder.convert(entry, raw)`).
    Framing errors go to the policy, counted in the Envelopes they dispose of.
    """
    return assembled_entries(dts_records_to_assembled(records, policy, reassembler, finish), policy, raw)


def assembled_entries(items: Iterable[Assembled], policy: ErrorPolicy, raw: bool = False) -> Iterator[tuple]:
    """Each Entry of complete Entries as (where, Entry), or with `raw` (where, Entry, its bytes or
    None), counted as input."""
    tally = policy.tally
    for item in items:
        where = {"partition": item.partition, "offset": item.first_offset}
        raws = item.raws
        for index, entry in enumerate(item.entries.items):
            tally.input += 1
            if raw:
                yield {**where, "entry": index}, entry, raws[index] if raws is not None else None
            else:
                yield {**where, "entry": index}, entry


def dts_json_lines_to_entries(lines: Iterable[tuple[int, bytes]], policy: ErrorPolicy,
                              source: str | None = None) -> Iterator[tuple[dict, pb.Entry]]:
    """(line number, line) of a dts-json file -> (where, Entry); bad lines go to the policy."""
    for number, line in lines:
        policy.tally.input += 1
        try:
            entry = entry_from_json_line(line, number, source)
        except BridgeError as err:
            policy.reject(err, line)
            continue
        yield {"line": number}, entry


def counted(policy: ErrorPolicy, where: dict, convert: Callable[..., Any], *args) -> Any:
    """`convert(*args)` for one record, the substitutions it made counted under the policy (and
    written to its ledger) once it returned: a record that fails counts none."""
    slot = SUBSTITUTION_NOTES
    outer, notes = slot.notes, []
    slot.notes = notes
    try:
        out = convert(*args)
    finally:
        slot.notes = outer
    if notes:
        policy.substituted(notes, where)
    return out


def entries_to_outputs(entries: Iterable[tuple], convert: Callable[..., Any], policy: ErrorPolicy, *,
                       size: Callable[[Any], int] = len) -> Iterator[tuple[dict, Any]]:
    """Apply a per-Entry converter; yields (where, its output) per Entry, `size(output)` messages.

    `entries` gives (where, Entry) or (where, Entry, raw bytes) (`dts_records_to_entries(raw=True)`);
    bytes that are there are passed on as `convert(entry, raw)`.
    An Entry giving no output counts as not emitted; one that fails goes to the policy, and under
    `keep` yields (where with its "error", None).
    """
    tally = policy.tally
    # `counted`, unrolled for a loop that runs once per Entry: one thread-local store per Entry
    slot, notes = SUBSTITUTION_NOTES, []
    named = ("partition", "offset", "line", "entry") if policy.name_entry else ("partition", "offset", "line")
    try:
        for item in entries:
            where, entry = item[0], item[1]
            if notes:
                notes.clear()  # a rejected Entry's, or noted between Entries (a lazy second pass)
            slot.notes = notes
            try:
                outputs = convert(entry) if len(item) < 3 or item[2] is None else convert(entry, item[2])
            except BridgeError as err:
                err.located(**{k: v for k, v in where.items() if k in named})
                # an Entry's bytes, or the record itself where it is not a protobuf message (a line)
                policy.reject(err, entry.SerializeToString() if hasattr(entry, "SerializeToString") else entry)
                if policy.on_error == "keep":
                    yield {**where, "error": str(err)}, None
                continue
            if notes:
                policy.substituted(notes, where)
                notes.clear()
            n = size(outputs)
            if n:
                tally.converted += 1
            else:
                tally.not_emitted += 1
            tally.outputs += n
            yield where, outputs
    finally:
        slot.notes = None


def entries_to_messages(entries: Iterable[tuple], convert: Callable[..., list],
                        policy: ErrorPolicy) -> Iterator[tuple[dict, Any]]:
    """`entries_to_outputs` message by message (e.g. of BlobEncoder.convert): (where with the
    message's "row" index, message), and (where with "error", None) for a failed Entry under `keep`."""
    for where, outputs in entries_to_outputs(entries, convert, policy):
        if outputs is None:
            yield where, None
            continue
        for index, item in enumerate(outputs):
            yield {**where, "row": index}, item


def decoder_entries(records: Iterable[tuple[dict, Any, Any]], decoder: Decoder, policy: ErrorPolicy,
                    feed: Callable[[Any, dict], list], parse: Callable[[Any, dict], Any] | None = None
                    ) -> Iterator[tuple[dict, pb.Entry, Any]]:
    """(where, raw, extra) records -> (where, Entry, extra) through a stateful decoder (BlobDecoder,
    TupleDecoder) under the policy.

    A record counts as converted once the Entry it belongs to is complete (an update's two halves,
    the rows of one event), so `decoder.pending` records are neither converted nor rejected until
    their partners come or `decoder.finish()` reports them. `parse` turns raw input into what
    `feed(item, where)` takes; an error it raises may dispose of several records (`err.count`).
    """
    tally = policy.tally
    base, fed = tally.converted, 0
    for where, raw, extra in records:
        tally.input += 1
        try:
            entries = feed(parse(raw, where) if parse else raw, where)
        except BridgeError as err:
            count = getattr(err, "count", 1)
            tally.input += count - 1
            policy.reject(err.located(**where), raw, count)
            continue
        fed += 1
        for err in _drain(decoder):
            fed -= err.count
            policy.reject(err, None, err.count)
        tally.converted = base + fed - decoder.pending
        for entry in entries:
            tally.outputs += 1
            yield where, entry, extra
    for err in decoder.finish():
        fed -= err.count
        policy.reject(err, None, err.count)
    tally.converted = base + fed


def _drain(decoder: Decoder) -> list:
    evicted = decoder.evicted
    if not evicted:
        return []
    out = list(evicted)
    evicted.clear()
    return out


def blob_lines_to_entries(lines: Iterable[bytes | tuple[int, bytes]], policy: ErrorPolicy,
                          options: Options = DEFAULT_OPTIONS, source: str | None = None
                          ) -> Iterator[tuple[dict, pb.Entry]]:
    """Blob JSON Lines -> (where, Entry). Messages of one Entry (an update pair, the rows of an
    event) all count as converted when it completes; unpaired halves are rejected at the end."""
    decoder = BlobDecoder(options)

    def records():
        for number, item in enumerate(lines, 1):
            number, line = item if isinstance(item, tuple) else (number, item)
            if isinstance(line, BridgeError) or line.strip():  # (a line over max_line_bytes: read_lines)
                yield {"line": number, "source": source} if source else {"line": number}, line, None

    def feed(line, where):
        if isinstance(line, BridgeError):
            raise line
        return decoder.feed_line(line, line=where["line"], source=source)

    for where, entry, _ in decoder_entries(records(), decoder, policy, feed):
        yield where, entry


def tuple_rows_to_entries(rows: Iterable[tuple[int, Any]], decoder, policy: ErrorPolicy
                          ) -> Iterator[tuple[dict, pb.Entry]]:
    """(row number, row dict or the reader's BridgeError) -> (where, Entry) through a TupleDecoder."""
    def parse(row, where):
        if isinstance(row, BridgeError):
            raise row
        return row

    def feed(row, where):
        return decoder.feed(row, number=where["row"])

    records = (({"row": number}, row, None) for number, row in rows)
    for where, entry, _ in decoder_entries(records, decoder, policy, feed, parse):
        yield where, entry
