"""dts-datahub-bridge: Tencent Cloud DTS subscription messages <-> Alibaba Cloud DataHub messages.

>>> import bridge
>>> entry = bridge.pb.Entry(header=bridge.pb.Header(messageType=bridge.pb.BEGIN, timestamp=1605339932, seqId=1))
>>> _ = entry.event.beginEvent.SetInParent()
>>> [m["payload"]["op"] for m in bridge.entry_to_blob(entry)]
['TRANSACTION_BEGIN']
>>> list(bridge.blob_to_entries(bridge.entry_to_blob(entry)))[0] == entry
True
"""
from bridge.blob.decode import BlobDecoder, blob_to_entries, decode_blob
from bridge.blob.encode import (
    BlobEncoder,
    encode_blob,
    entries_to_blob,
    entry_to_blob,
    shard_key,
)
from bridge.blob.lines import entries_to_blob_lines, stream_blob_lines
from bridge.blob.validation import validate_blob
from bridge.errors import (
    BlobFormatError,
    BridgeError,
    ConversionError,
    DecodeError,
    FramingError,
    OptionsError,
    OutputTooLargeError,
    TupleFormatError,
)
from bridge.options import DEFAULT_OPTIONS, Options
from bridge.tuple import (
    TupleDecoder,
    TupleEncoder,
    entries_to_tuples,
    entry_to_tuples,
    load_record_schema,
    record_schema,
    tuples_to_entries,
)
from bridge.wire import subscribe_pb2 as pb
from bridge.wire.framing import (
    Assembled,
    Reassembler,
    pack_entries,
    read_dts_json,
    read_pb,
    split_entries,
    write_dts_json,
    write_pb,
)

__all__ = [
    "pb", "Options", "DEFAULT_OPTIONS",
    "entry_to_blob", "entries_to_blob", "entries_to_blob_lines", "stream_blob_lines", "blob_to_entries", "encode_blob", "decode_blob", "validate_blob",
    "shard_key", "BlobEncoder", "BlobDecoder",
    "entry_to_tuples", "entries_to_tuples", "tuples_to_entries", "record_schema", "load_record_schema",
    "TupleEncoder", "TupleDecoder",
    "BridgeError", "FramingError", "DecodeError", "ConversionError", "BlobFormatError",
    "TupleFormatError", "OptionsError", "OutputTooLargeError",
    "Reassembler", "Assembled", "split_entries", "pack_entries", "read_pb", "write_pb",
    "read_dts_json", "write_dts_json",
]
