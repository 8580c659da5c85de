"""What the Blob decoder holds between messages: the one owner of the pairing state (`Pairing`).

An update travels as two messages (UPDATE_BEFOR, UPDATE_AFTER) sharing a sequenceId, and the rows
of one DML event as one message each (`dts.row` = [index, count]); `Pairing` keeps the halves
waiting for their partner and the events waiting for their rows, for both ways a message comes
in: the Python path (`partner`, `pair`, `regroup`: protobuf messages) and the C lane
(`assemble`: Entry and row bytes, parsed once when the Entry completes). The lane holds on bytes
only while the Python state is empty, and hands what it holds over (`unassemble`) before the
Python path takes a message, so at any time one of the two holds it all. One window
(`max_pending` halves), one eviction path (`pair`: the lane leaves a full window to the Python
path), one count of what waits (`pending`: kept up to date wherever a message is taken or let go,
as the stream layer asks for it after every record), and one report of what is lost (`evicted`,
`lost`, `finish`).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from bridge.blob.shape import _OP_OF_HALF
from bridge.errors import ConversionError
from bridge.native import speedups
from bridge.wire import subscribe_pb2 as pb

_ENTRY_FROM, _ROW_FROM = pb.Entry.FromString, pb.RowChange.FromString
_WITH_ROWS = getattr(speedups, "with_rows", None)  # (the lane runs only where C does)
_UPDATE = int(pb.UPDATE)


@dataclass
class _Row:
    """One row change being rebuilt (an update waits for its second half)."""
    seq: str
    row: pb.RowChange
    halves: set = field(default_factory=set)
    line: int | None = None
    unknown: bytes | None = None  # the Entry-level unknown fields of its message (both halves carry them)
    reserved: bool = False  # its message's extension held reserved-prefix properties (`_reserved`)


@dataclass
class _Event:
    """A DML event being regrouped from its rows' messages (lossless extension)."""
    entry: pb.Entry
    nrows: int
    rows: dict = field(default_factory=dict)  # row index -> RowChange
    messages: int = 0
    reserved: bool = False  # a message of it had reserved-prefix properties in its extension


class Pairing:
    """The update halves and the DML events' rows a `BlobDecoder` holds until their partners come."""

    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        # the Python path's: sequenceId -> (_Row, facts, Entry, column-set key); event key -> _Event
        self.halves: OrderedDict = OrderedDict()
        self.events: OrderedDict = OrderedDict()
        # the lane's, on bytes, while the two above are empty (`assemble`): sequenceId -> (Entry bytes,
        # row bytes, half, column-set key, line); (Entry bytes, row count, column-set key) -> [rows
        # by index, messages]
        self.lane_halves: dict = {}
        self.lane_events: dict = {}
        # halves pushed out of the window and messages lost with a rejected one: errors for the caller
        self.evicted: list[ConversionError] = []
        self.completed = 0  # messages held before the one being read that its Entry completed (`lost`)
        # messages held: update halves and the rows of open events, wherever they wait (the four
        # containers above: `len(halves) + sum(e.messages for e in events.values()) + len(lane_halves)
        # + sum(e[1] for e in lane_events.values())`), counted as they change rather than summed
        self.pending = 0

    def finish(self) -> list[ConversionError]:
        """`evicted`, and an error for every update half or partial event still waiting; empties all."""
        self.unassemble()
        errors = self.evicted
        self.evicted = []
        for seq, (row, *_) in self.halves.items():
            missing = next(op for half, op in _OP_OF_HALF.items() if half not in row.halves)
            err = ConversionError(f"update half without its partner at end of input ({missing} missing)",
                                  sequence_id=seq, line=row.line)
            err.count = 1
            errors.append(err)
        for event in self.events.values():
            err = ConversionError(f"DML event incomplete at end of input: {len(event.rows)} of "
                                  f"{event.nrows} rows", seq_id=event.entry.header.seqId)
            err.count = event.messages
            errors.append(err)
        self.halves.clear()
        self.events.clear()
        self.pending = 0
        return errors

    def lost(self, seq, line) -> None:
        """The message being read (at `line`) completed its Entry (an update's other half, the other
        rows of its event: `completed` messages held before it), and is rejected: they go with it,
        each counted, as an error in `evicted` (the caller rejects this one; a stream counts
        records, so the law `converted + rejected + not_emitted == input` keeps them out of
        `converted`)."""
        held, self.completed = self.completed, 0
        if held:
            err = ConversionError(f"{held} earlier message{'s' if held > 1 else ''} of an Entry whose last message "
                                  f"(line {line}) was rejected", sequence_id=seq)
            err.count = held
            self.evicted.append(err)

    # -- the Python path -------------------------------------------------------------------------
    def partner(self, seq, half, entry, columns_key, unknown_key=None):
        """The waiting other half of an update (None if this half is the first); raises for a
        second half of the same kind and for halves naming different tables, carrying different
        headers (the timestamp aside), different column sets or different unknown fields of the
        Entry."""
        pending = self.halves.get(seq)
        if pending is None:
            return None
        holder, _, other_entry, other_columns = pending
        if half in holder.halves:
            raise ConversionError(f"two {_OP_OF_HALF[half]} messages share a "
                                  f"sequenceId (the first, line {holder.line}, still waits for its partner)",
                                  sequence_id=seq)
        bh, ah = (other_entry.header, entry.header) if half == "after" else (entry.header, other_entry.header)
        if (bh.schemaName, bh.tableName, bh.sourceType) != (ah.schemaName, ah.tableName, ah.sourceType):
            # this half is rejected; the waiting one keeps waiting (its partner may still come, and
            # if not, `finish` reports it): neither vanishes
            raise ConversionError("the halves of an update name different tables", sequence_id=seq)
        if bh != ah and not _same_but_time(bh, ah):  # a differing timestamp travels as before.eventTime
            raise ConversionError("the halves of an update carry different headers", sequence_id=seq)
        # one row has one column set: halves with different ones (primaryKey, types) cannot join.
        # Equal keys (the JSON of schema.dataColumn and dts.columns) are the same set; different
        # keys may be too (a half whose extension was left out because it said nothing new, beside
        # one that has it): then the columns themselves decide
        if ((columns_key is None or columns_key != other_columns)
                and entry.event.dmlEvent.columns != other_entry.event.dmlEvent.columns):
            raise ConversionError("the halves of an update carry different column sets", sequence_id=seq)
        if holder.unknown != unknown_key:
            raise ConversionError("the halves of an update carry different unknown fields", sequence_id=seq)
        return pending

    def pair(self, seq, half, row, facts, entry, partner, columns_key, unknown_key, line, reserved):
        """Join the two halves of an update (`row` already holds both images); returns (row,
        facts, complete). Without a partner the half waits (from `line`; `reserved`: its message's
        extension held reserved-prefix properties); a full window reports its oldest half."""
        halves = self.halves
        if partner is None:
            held = len(halves)
            if held >= self.max_pending:
                # the oldest waiting half is reported (see `evicted`), the current one waits
                old_seq, (old, *_) = halves.popitem(last=False)
                err = ConversionError(f"update half without its partner within {self.max_pending} messages",
                                      sequence_id=old_seq, line=old.line)
                err.count = 1
                self.evicted.append(err)
            halves[seq] = (_Row(seq, row, {half}, line, unknown_key, reserved), facts, entry, columns_key)
            self.pending += len(halves) - held
            return row, facts, False
        _, other_facts, other_entry, _ = partner
        del halves[seq]
        self.pending -= 1
        self.completed = 1  # the waiting half, no longer held
        before_entry = other_entry if half == "after" else entry
        after_entry = entry if half == "after" else other_entry
        bh, ah = before_entry.header, after_entry.header
        before_facts, after_facts = (other_facts, facts) if half == "after" else (facts, other_facts)
        if bh.timestamp != ah.timestamp and "eventTime" not in before_facts:
            before_facts = {**before_facts, "eventTime": str(bh.timestamp * 1000)}
        out = dict(after_facts)
        for key in set(before_facts) | set(after_facts):
            if before_facts.get(key) != after_facts.get(key):
                out["before." + key] = before_facts.get(key, "default")
        if half == "before":
            entry.CopyFrom(other_entry)
            entry.event.dmlEvent.ClearField("rows")
        return row, out, True

    def regroup(self, entry, row, row_index, nrows, columns_key, unknown_key, reserved) -> _Event | None:
        """A row of an event of `nrows` > 1 rows: the event once its last row came (its Entry
        holds them all; `reserved` is whether any of its messages' extensions held reserved-prefix
        properties), else None."""
        # the rows of one event: same header, same event properties, same dmlEvent (its columns,
        # which the column-set key fixes, and its type; else its bytes), same row count. A
        # message differing in any of them starts an event of its own (reported if it never
        # completes): it never merges into another, losing what differs.
        key = _event_key(entry, nrows, columns_key, unknown_key)
        event = self.events.get(key)
        if event is None:
            event = self.events[key] = _Event(entry, nrows)
        if row_index in event.rows:  # (0 <= row_index < nrows: checked by the decoder)
            raise ConversionError(f"row {row_index} of {nrows} repeated", seq_id=entry.header.seqId)
        event.rows[row_index] = row
        messages = 2 if key[1] == _UPDATE else 1
        event.messages += messages
        self.pending += messages
        event.reserved = event.reserved or reserved
        if len(event.rows) < nrows:
            return None
        del self.events[key]
        self.pending -= event.messages
        self.completed += event.messages - messages  # its other rows' messages
        rows = event.rows
        event.entry.event.dmlEvent.rows.extend([rows[i] for i in range(nrows)])
        return event

    # -- the lane, on bytes ----------------------------------------------------------------------
    def assemble(self, entry_bytes, row_bytes, row_index, nrows, seq, half, columns_key, grouped, update, line
                 ) -> list[pb.Entry] | None:
        """The lane's message (`BlobDecoder._lane`) completed on bytes while the Python state
        (`halves`, `events`) is empty: update halves wait in `lane_halves` and an event's rows in
        `lane_events`, and an Entry is parsed once, whole (`with_rows`). Plan.lane writes the Header
        canonically, so equal Entry bytes are what `partner` and `regroup` call the same Entry:
        halves with equal bytes and column-set key join with no fact, and rows with equal bytes,
        count and key are one event's. None wherever Python would do more than that (the Python
        state not empty, halves that differ, a second half of a kind, a repeated row, the pairing
        window full): then what the lane holds has been handed to the Python state (`unassemble`),
        nothing else changed, and the message goes the Python way."""
        if self.halves or self.events or _WITH_ROWS is None:
            return None  # (the lane holds nothing then)
        halves = self.lane_halves
        if half != "both":
            waiting = halves.get(seq)
            if waiting is None:
                if len(halves) >= self.max_pending:
                    return self._hand_over()  # the Python path evicts
                halves[seq] = (entry_bytes, row_bytes, half, columns_key, line)
                self.pending += 1
                return []
            if waiting[2] == half or waiting[0] != entry_bytes or waiting[3] != columns_key:
                return self._hand_over()
            row_bytes = waiting[1] + row_bytes  # protobuf merges the two halves' images into one row
        if not grouped or nrows == 1:
            if half != "both":
                del halves[seq]
                self.pending -= 1
            return [_ENTRY_FROM(_WITH_ROWS(entry_bytes, [row_bytes]))]
        key = (entry_bytes, nrows, columns_key)
        event = self.lane_events.get(key)
        if event is None:
            event = self.lane_events[key] = [{}, 0]  # row index -> row bytes (as many as came), messages
        elif row_index in event[0]:
            return self._hand_over()  # a repeated row: Python's error
        rows = event[0]
        rows[row_index] = row_bytes
        messages = 2 if update else 1
        event[1] += messages
        if half != "both":  # (last: nothing above may leave the half neither waiting nor in its row)
            del halves[seq]
            messages -= 1  # the waiting half, now in its row
        if len(rows) < nrows:
            self.pending += messages
            return []
        del self.lane_events[key]
        self.pending += messages - event[1]
        return [_ENTRY_FROM(_WITH_ROWS(entry_bytes, [rows[i] for i in range(nrows)]))]

    def _hand_over(self) -> None:
        self.unassemble()
        return None

    def unassemble(self) -> None:
        """Move what the lane holds on bytes into the Python state, as the Python path builds it
        (`pair`'s waiting half, `regroup`'s open event), in the order the lane took it."""
        if self.lane_halves:
            for seq, (entry_bytes, row_bytes, half, columns_key, line) in self.lane_halves.items():
                self.halves[seq] = (_Row(seq, _ROW_FROM(row_bytes), {half}, line), {}, _ENTRY_FROM(entry_bytes),
                                    columns_key)
            self.lane_halves.clear()
        if self.lane_events:
            for (entry_bytes, nrows, columns_key), (rows, messages) in self.lane_events.items():
                entry = _ENTRY_FROM(entry_bytes)
                key = _event_key(entry, nrows, columns_key)
                if key in self.events:  # (cannot be: the lane holds only while the Python state is empty)
                    raise RuntimeError("Pairing: an event held by the lane is open in the Python state too")
                event = self.events[key] = _Event(entry, nrows)
                event.rows = {i: _ROW_FROM(row) for i, row in rows.items()}
                event.messages = messages
            self.lane_events.clear()


def _event_key(entry, nrows, columns_key=None, unknown_key=None) -> tuple:
    """What the rows of one event share: its header, DML type, columns (the column-set key, else
    the DMLEvent's bytes), event properties, row count and unknown fields (`Pairing.regroup`)."""
    dml = entry.event.dmlEvent
    event_props = entry.event.properties
    return (entry.header.SerializeToString(), dml.dmlEventType,
            ("json", columns_key) if columns_key is not None else ("pb", dml.SerializeToString()),
            tuple((p.key, p.value) for p in event_props) if event_props else None, nrows, unknown_key)


def _same_but_time(a, b) -> bool:
    """Whether two headers differ in their timestamp at most."""
    c = type(a)()
    c.CopyFrom(a)
    c.timestamp = b.timestamp
    return c == b
