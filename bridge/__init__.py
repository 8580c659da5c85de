"""dts-datahub-bridge: Tencent Cloud DTS subscription messages <-> Alibaba Cloud DataHub messages."""
from . import subscribe_pb2 as pb
from ._wire import (Assembled, Reassembler, pack_entries, read_dts_json, read_pb, split_entries,
                    write_dts_json, write_pb)
from .errors import (BlobFormatError, BridgeError, ConversionError, DecodeError, FramingError,
                     OptionsError, TupleFormatError)
from .options import DEFAULT_OPTIONS, Options

__all__ = [
    "pb", "Options", "DEFAULT_OPTIONS",
    "BridgeError", "FramingError", "DecodeError", "ConversionError", "BlobFormatError",
    "TupleFormatError", "OptionsError",
    "Reassembler", "Assembled", "split_entries", "pack_entries", "read_pb", "write_pb",
    "read_dts_json", "write_dts_json",
]
