"""Rules of a DTS event that Blob and Tuple share: sequence ids, the DML event checks every
converter makes first (in the order docs/decisions.md, "One order of errors", fixes), the Event
field of each MessageType, and the property prefix the bridge owns.

>>> sequence_id(9, 2)
'9000002'
"""
from __future__ import annotations

from typing import Protocol

from bridge.errors import BridgeError, ConversionError
from bridge.values.ops import DML_IMAGES
from bridge.wire import subscribe_pb2 as pb

__all__ = ["ROW_DIGITS", "RESERVED_PREFIX", "EVENT_FIELDS", "sequence_id", "seq_id_of", "entry_group", "digits",
           "check_dml_event", "check_row_images", "Decoder"]

ROW_DIGITS = 6  # sequenceId = seqId * 10**ROW_DIGITS + row index in the event
_ROW_SCALE = 10 ** ROW_DIGITS
RESERVED_PREFIX = "datahub:"  # DTS property keys the bridge owns (DataHub-only facts)

# MessageType -> the Event field holding its sub-message.
EVENT_FIELDS: dict[int, str] = {
    pb.BEGIN: "beginEvent", pb.COMMIT: "commitEvent", pb.DML: "dmlEvent", pb.DDL: "ddlEvent",
    pb.ROLLBACK: "rollbackEvent", pb.HEARTBEAT: "heartbeatEvent", pb.CHECKPOINT: "checkpointEvent",
}


def sequence_id(seq_id: int, row: int = 0) -> str:
    """The sequenceId (Blob) / `_sequence_id_` (Tuple) of row `row` of the event `seq_id` numbers."""
    return str(seq_id * _ROW_SCALE + row)


def seq_id_of(sequence: int) -> int:
    """The seqId of the Entry a sequenceId (Blob) / `_sequence_id_` (Tuple) numbers a row of: what
    every decoder writes into the rebuilt Header (0 past 64 bits, where no seqId can hold it).

    >>> seq_id_of(9000002)
    9
    """
    seq_id = sequence // _ROW_SCALE
    return seq_id if seq_id < 1 << 64 else 0


def entry_group(sequence: int, rows: int = 1) -> tuple:
    """The one definition of an Entry for records read without the bridge's position attributes:
    which records a decoder rebuilds into one Entry, so the shard merge keeps them together (a
    stream that moves to another group leaves the open one incomplete).

    A record that is one row of a DML event of `rows` > 1 rows (a lossless Blob line's `dts.row`
    [index, rows]) belongs with the other rows of the Entry whose seqId is `seq_id_of(sequence)`
    (the decoder regroups them by that Header); any other record (a strict line, a Tuple row, a
    one-row, DDL or control line) is an Entry of its own, `sequence` (an UPDATE's two halves share
    it, and the decoders pair them by it).

    >>> entry_group(9000002, rows=3) == entry_group(9000000, rows=3), entry_group(9000002) == entry_group(9000000)
    (True, False)
    """
    return (seq_id_of(sequence), rows) if rows > 1 else (sequence,)


def digits(text) -> bool:
    """Whether `text` is a str of ASCII digits only: what `int()` reads back as the same number
    (`str.isdigit()` alone also takes "²" and other digits `int()` refuses)."""
    return type(text) is str and text.isascii() and text.isdigit()


def signed_digits(text) -> bool:
    """`digits`, after an optional leading "-": a whole number as `int()` reads it back."""
    return digits(text[1:] if type(text) is str and text[:1] == "-" else text)


def check_dml_event(dml: pb.DMLEvent) -> bool:
    """The event-level rules every converter of a DML event checks first; False for an event
    without rows (nothing to emit). Raises ConversionError for an unknown DMLType and for more rows
    than a sequenceId can number.

    The order of a converter's checks is fixed (docs/decisions.md, "One order of errors"): this,
    then the columns, the SourceType and the timestamp (what the Entry says once), then
    `check_row_images`, then the values row by row; the C fast path keeps it."""
    if dml.dmlEventType not in DML_IMAGES:
        raise ConversionError(f"unknown DMLType {dml.dmlEventType}")
    if not dml.rows:
        return False
    if len(dml.rows) > _ROW_SCALE:
        raise ConversionError(f"DML event has {len(dml.rows)} rows; at most {_ROW_SCALE} fit a sequenceId")
    return True


# DMLType -> (its op, the RowChange field its row changes must leave empty) for the types of one image
_WRONG_IMAGE = {t: (images[0].op, "newColumns" if images[0].field == "oldColumns" else "oldColumns")
                for t, images in DML_IMAGES.items() if len(images) == 1}


def check_row_images(dml: pb.DMLEvent, first: int = 0) -> None:
    """Raises ConversionError for an INSERT row change with a before image or a DELETE one with an
    after image (rows from `first` on: a streamed Entry's rows before it were checked in C)."""
    found = _WRONG_IMAGE.get(dml.dmlEventType)
    if found is not None:
        op, wrong = found
        rows = dml.rows
        for index in range(first, len(rows)):
            if getattr(rows[index], wrong):
                raise ConversionError(f"{op} row change {index} carries a "
                                      f"{'before' if wrong == 'oldColumns' else 'after'} image")


class Decoder(Protocol):
    """What the stream layer (`bridge.stream.decoder_entries`) asks of a decoder that rebuilds
    Entries from DataHub records: `BlobDecoder` (messages) and `TupleDecoder` (rows) both are one.
    Each has its own `feed` (a record in, the Entries it completes out); besides that:

    - `pending`: records fed but not yet part of a returned Entry (update halves, open events);
    - `evicted`: errors for records pushed out of the pairing window (`max_pending`), each with
      `.count`, the records it stands for; the caller reports them and clears the list;
    - `finish()`: at end of input, `evicted` and an error for everything still pending.
    """

    evicted: list[BridgeError]

    @property
    def pending(self) -> int: ...

    def finish(self) -> list[BridgeError]: ...
