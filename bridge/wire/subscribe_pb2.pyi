from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DMLType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSERT: _ClassVar[DMLType]
    UPDATE: _ClassVar[DMLType]
    DELETE: _ClassVar[DMLType]

class MessageType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BEGIN: _ClassVar[MessageType]
    COMMIT: _ClassVar[MessageType]
    DML: _ClassVar[MessageType]
    DDL: _ClassVar[MessageType]
    ROLLBACK: _ClassVar[MessageType]
    HEARTBEAT: _ClassVar[MessageType]
    CHECKPOINT: _ClassVar[MessageType]

class SourceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ORACLE: _ClassVar[SourceType]
    MYSQL: _ClassVar[SourceType]
    PGSQL: _ClassVar[SourceType]
    MARIADB: _ClassVar[SourceType]

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NIL: _ClassVar[DataType]
    INT8: _ClassVar[DataType]
    INT16: _ClassVar[DataType]
    INT32: _ClassVar[DataType]
    INT64: _ClassVar[DataType]
    UINT8: _ClassVar[DataType]
    UINT16: _ClassVar[DataType]
    UINT32: _ClassVar[DataType]
    UINT64: _ClassVar[DataType]
    FLOAT32: _ClassVar[DataType]
    FLOAT64: _ClassVar[DataType]
    BYTES: _ClassVar[DataType]
    DECIMAL: _ClassVar[DataType]
    STRING: _ClassVar[DataType]
    NA: _ClassVar[DataType]
INSERT: DMLType
UPDATE: DMLType
DELETE: DMLType
BEGIN: MessageType
COMMIT: MessageType
DML: MessageType
DDL: MessageType
ROLLBACK: MessageType
HEARTBEAT: MessageType
CHECKPOINT: MessageType
ORACLE: SourceType
MYSQL: SourceType
PGSQL: SourceType
MARIADB: SourceType
NIL: DataType
INT8: DataType
INT16: DataType
INT32: DataType
INT64: DataType
UINT8: DataType
UINT16: DataType
UINT32: DataType
UINT64: DataType
FLOAT32: DataType
FLOAT64: DataType
BYTES: DataType
DECIMAL: DataType
STRING: DataType
NA: DataType

class KVPair(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("version", "total", "index", "data", "properties")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    version: int
    total: int
    index: int
    data: bytes
    properties: _containers.RepeatedCompositeFieldContainer[KVPair]
    def __init__(self, version: _Optional[int] = ..., total: _Optional[int] = ..., index: _Optional[int] = ..., data: _Optional[bytes] = ..., properties: _Optional[_Iterable[_Union[KVPair, _Mapping]]] = ...) -> None: ...

class Entries(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, items: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("header", "event")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    header: Header
    event: Event
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., event: _Optional[_Union[Event, _Mapping]] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("version", "sourceType", "messageType", "timestamp", "serverId", "fileName", "position", "gtid", "schemaName", "tableName", "seqId", "eventIndex", "isLast", "properties")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCETYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGETYPE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SERVERID_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    GTID_FIELD_NUMBER: _ClassVar[int]
    SCHEMANAME_FIELD_NUMBER: _ClassVar[int]
    TABLENAME_FIELD_NUMBER: _ClassVar[int]
    SEQID_FIELD_NUMBER: _ClassVar[int]
    EVENTINDEX_FIELD_NUMBER: _ClassVar[int]
    ISLAST_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    version: int
    sourceType: SourceType
    messageType: MessageType
    timestamp: int
    serverId: int
    fileName: str
    position: int
    gtid: str
    schemaName: str
    tableName: str
    seqId: int
    eventIndex: int
    isLast: bool
    properties: _containers.RepeatedCompositeFieldContainer[KVPair]
    def __init__(self, version: _Optional[int] = ..., sourceType: _Optional[_Union[SourceType, str]] = ..., messageType: _Optional[_Union[MessageType, str]] = ..., timestamp: _Optional[int] = ..., serverId: _Optional[int] = ..., fileName: _Optional[str] = ..., position: _Optional[int] = ..., gtid: _Optional[str] = ..., schemaName: _Optional[str] = ..., tableName: _Optional[str] = ..., seqId: _Optional[int] = ..., eventIndex: _Optional[int] = ..., isLast: _Optional[bool] = ..., properties: _Optional[_Iterable[_Union[KVPair, _Mapping]]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("beginEvent", "dmlEvent", "commitEvent", "ddlEvent", "rollbackEvent", "heartbeatEvent", "checkpointEvent", "properties")
    BEGINEVENT_FIELD_NUMBER: _ClassVar[int]
    DMLEVENT_FIELD_NUMBER: _ClassVar[int]
    COMMITEVENT_FIELD_NUMBER: _ClassVar[int]
    DDLEVENT_FIELD_NUMBER: _ClassVar[int]
    ROLLBACKEVENT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEATEVENT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTEVENT_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    beginEvent: BeginEvent
    dmlEvent: DMLEvent
    commitEvent: CommitEvent
    ddlEvent: DDLEvent
    rollbackEvent: RollbackEvent
    heartbeatEvent: HeartbeatEvent
    checkpointEvent: CheckpointEvent
    properties: _containers.RepeatedCompositeFieldContainer[KVPair]
    def __init__(self, beginEvent: _Optional[_Union[BeginEvent, _Mapping]] = ..., dmlEvent: _Optional[_Union[DMLEvent, _Mapping]] = ..., commitEvent: _Optional[_Union[CommitEvent, _Mapping]] = ..., ddlEvent: _Optional[_Union[DDLEvent, _Mapping]] = ..., rollbackEvent: _Optional[_Union[RollbackEvent, _Mapping]] = ..., heartbeatEvent: _Optional[_Union[HeartbeatEvent, _Mapping]] = ..., checkpointEvent: _Optional[_Union[CheckpointEvent, _Mapping]] = ..., properties: _Optional[_Iterable[_Union[KVPair, _Mapping]]] = ...) -> None: ...

class BeginEvent(_message.Message):
    __slots__ = ("transactionId", "threadId")
    TRANSACTIONID_FIELD_NUMBER: _ClassVar[int]
    THREADID_FIELD_NUMBER: _ClassVar[int]
    transactionId: str
    threadId: int
    def __init__(self, transactionId: _Optional[str] = ..., threadId: _Optional[int] = ...) -> None: ...

class CommitEvent(_message.Message):
    __slots__ = ("transactionId",)
    TRANSACTIONID_FIELD_NUMBER: _ClassVar[int]
    transactionId: str
    def __init__(self, transactionId: _Optional[str] = ...) -> None: ...

class DDLEvent(_message.Message):
    __slots__ = ("schemaName", "sql", "executionTime")
    SCHEMANAME_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    EXECUTIONTIME_FIELD_NUMBER: _ClassVar[int]
    schemaName: str
    sql: str
    executionTime: int
    def __init__(self, schemaName: _Optional[str] = ..., sql: _Optional[str] = ..., executionTime: _Optional[int] = ...) -> None: ...

class RollbackEvent(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HeartbeatEvent(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class CheckpointEvent(_message.Message):
    __slots__ = ("syncedGtid", "fakeGtid", "fileName", "position")
    SYNCEDGTID_FIELD_NUMBER: _ClassVar[int]
    FAKEGTID_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    syncedGtid: str
    fakeGtid: bool
    fileName: str
    position: int
    def __init__(self, syncedGtid: _Optional[str] = ..., fakeGtid: _Optional[bool] = ..., fileName: _Optional[str] = ..., position: _Optional[int] = ...) -> None: ...

class DMLEvent(_message.Message):
    __slots__ = ("dmlEventType", "columns", "rows")
    DMLEVENTTYPE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    dmlEventType: DMLType
    columns: _containers.RepeatedCompositeFieldContainer[Column]
    rows: _containers.RepeatedCompositeFieldContainer[RowChange]
    def __init__(self, dmlEventType: _Optional[_Union[DMLType, str]] = ..., columns: _Optional[_Iterable[_Union[Column, _Mapping]]] = ..., rows: _Optional[_Iterable[_Union[RowChange, _Mapping]]] = ...) -> None: ...

class Column(_message.Message):
    __slots__ = ("name", "originalType", "isKey", "properties")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ORIGINALTYPE_FIELD_NUMBER: _ClassVar[int]
    ISKEY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    name: str
    originalType: str
    isKey: bool
    properties: _containers.RepeatedCompositeFieldContainer[KVPair]
    def __init__(self, name: _Optional[str] = ..., originalType: _Optional[str] = ..., isKey: _Optional[bool] = ..., properties: _Optional[_Iterable[_Union[KVPair, _Mapping]]] = ...) -> None: ...

class RowChange(_message.Message):
    __slots__ = ("oldColumns", "newColumns", "properties")
    OLDCOLUMNS_FIELD_NUMBER: _ClassVar[int]
    NEWCOLUMNS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    oldColumns: _containers.RepeatedCompositeFieldContainer[Data]
    newColumns: _containers.RepeatedCompositeFieldContainer[Data]
    properties: _containers.RepeatedCompositeFieldContainer[KVPair]
    def __init__(self, oldColumns: _Optional[_Iterable[_Union[Data, _Mapping]]] = ..., newColumns: _Optional[_Iterable[_Union[Data, _Mapping]]] = ..., properties: _Optional[_Iterable[_Union[KVPair, _Mapping]]] = ...) -> None: ...

class Data(_message.Message):
    __slots__ = ("dataType", "charset", "sv", "bv")
    DATATYPE_FIELD_NUMBER: _ClassVar[int]
    CHARSET_FIELD_NUMBER: _ClassVar[int]
    SV_FIELD_NUMBER: _ClassVar[int]
    BV_FIELD_NUMBER: _ClassVar[int]
    dataType: DataType
    charset: str
    sv: str
    bv: bytes
    def __init__(self, dataType: _Optional[_Union[DataType, str]] = ..., charset: _Optional[str] = ..., sv: _Optional[str] = ..., bv: _Optional[bytes] = ...) -> None: ...
