"""Tencent DTS's wire format (the Protobuf messages of its Kafka subscription) transcribed field by field
from Tencent's published definition, independently of proto/subscribe.proto, and message classes compiled
from that transcription alone into a descriptor pool of their own: tests/test_proto.py holds the committed
proto and generated module to it, tests/test_blob_decode.py reads the bridge's DTS output with it.
`varint` is the wire format's base-128 integer written by hand from the encoding rules, for the tests
that build or check bytes without bridge.wire.framing.encode_varint."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

ROOT = Path(__file__).resolve().parent.parent.parent

# The wire format, transcribed: message -> [(number, type, name)]; "repeated X" marks lists.
SPEC_MESSAGES = {
    "Envelope": [(1, "int32", "version"), (2, "uint32", "total"), (3, "uint32", "index"), (4, "bytes", "data"),
                 (15, "repeated KVPair", "properties")],
    "Entries": [(1, "repeated Entry", "items")],
    "Entry": [(1, "Header", "header"), (2, "Event", "event")],
    "Header": [(1, "int32", "version"), (2, "SourceType", "sourceType"), (3, "MessageType", "messageType"),
               (4, "uint32", "timestamp"), (5, "int64", "serverId"), (6, "string", "fileName"),
               (7, "uint64", "position"), (8, "string", "gtid"), (9, "string", "schemaName"),
               (10, "string", "tableName"), (11, "uint64", "seqId"), (12, "uint64", "eventIndex"),
               (13, "bool", "isLast"), (15, "repeated KVPair", "properties")],
    "Event": [(1, "BeginEvent", "beginEvent"), (2, "DMLEvent", "dmlEvent"), (3, "CommitEvent", "commitEvent"),
              (4, "DDLEvent", "ddlEvent"), (5, "RollbackEvent", "rollbackEvent"),
              (6, "HeartbeatEvent", "heartbeatEvent"), (7, "CheckpointEvent", "checkpointEvent"),
              (15, "repeated KVPair", "properties")],
    "BeginEvent": [(1, "string", "transactionId"), (2, "int64", "threadId")],
    "CommitEvent": [(1, "string", "transactionId")],
    "DDLEvent": [(1, "string", "schemaName"), (2, "string", "sql"), (3, "uint32", "executionTime")],
    "RollbackEvent": [],
    "HeartbeatEvent": [(1, "int64", "epoch")],
    "CheckpointEvent": [(1, "string", "syncedGtid"), (2, "bool", "fakeGtid"), (3, "string", "fileName"),
                        (4, "uint64", "position")],
    "DMLEvent": [(1, "DMLType", "dmlEventType"), (2, "repeated Column", "columns"), (3, "repeated RowChange", "rows")],
    "Column": [(1, "string", "name"), (2, "string", "originalType"), (3, "bool", "isKey"),
               (15, "repeated KVPair", "properties")],
    "RowChange": [(1, "repeated Data", "oldColumns"), (2, "repeated Data", "newColumns"),
                  (15, "repeated KVPair", "properties")],
    "Data": [(1, "DataType", "dataType"), (2, "string", "charset"), (3, "string", "sv"), (4, "bytes", "bv")],
    "KVPair": [(1, "string", "key"), (2, "string", "value")],
}
SPEC_ENUMS = {
    "DMLType": {"INSERT": 0, "UPDATE": 1, "DELETE": 2},
    "MessageType": {"BEGIN": 0, "COMMIT": 1, "DML": 2, "DDL": 3, "ROLLBACK": 4, "HEARTBEAT": 5, "CHECKPOINT": 6},
    "SourceType": {"ORACLE": 0, "MYSQL": 1, "PGSQL": 2, "MARIADB": 3},
    "DataType": {"NIL": 0, "INT8": 1, "INT16": 2, "INT32": 3, "INT64": 4, "UINT8": 5, "UINT16": 6, "UINT32": 7,
                 "UINT64": 8, "FLOAT32": 9, "FLOAT64": 10, "BYTES": 11, "DECIMAL": 12, "STRING": 13, "NA": 14},
}


def spec_proto_text() -> str:
    lines = ['syntax = "proto3";', "package spec_check;"]
    for name, members in SPEC_ENUMS.items():
        lines += [f"enum {name} {{"] + [f"  {m} = {n};" for m, n in members.items()] + ["}"]
    for name, fields in SPEC_MESSAGES.items():
        lines += [f"message {name} {{"] + [f"  {t} {f} = {n};" for n, t, f in fields] + ["}"]
    return "\n".join(lines) + "\n"


def protoc(*args, cwd=ROOT):
    done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def compile_spec(tmp: Path) -> SimpleNamespace:
    """Entry and friends compiled from the transcription (package spec_check), in a pool of their own:
    nothing shared with bridge.wire.subscribe_pb2. `tmp` receives the .proto and the descriptor set."""
    (tmp / "spec_check.proto").write_text(spec_proto_text())
    protoc(f"-I{tmp}", f"--descriptor_set_out={tmp / 'spec.desc'}", "--include_imports", "spec_check.proto", cwd=tmp)
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString((tmp / "spec.desc").read_bytes()).file:
        pool.Add(file)
    return SimpleNamespace(pool=pool, **{
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"spec_check.{name}"))
        for name in SPEC_MESSAGES})


def varint(n: int, size: int | None = None) -> bytes:
    """n >= 0 as a protobuf varint: 7 bits a byte, least significant first, the high bit on all but the
    last. With `size`, exactly `size` bytes: overlong (padded with continuation bytes) when more than
    it needs, its low 7*size bits when fewer (the hostile framings of the fuzz target and its tests)."""
    out = bytearray()
    while True:
        out.append(n & 0x7F)
        n >>= 7
        if (size is None and not n) or (size is not None and len(out) == size):
            break
    for i in range(len(out) - 1):
        out[i] |= 0x80
    return bytes(out)
