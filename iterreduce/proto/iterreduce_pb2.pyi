from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("worker_name", "host", "pid", "resources_json", "peer_address", "shared_dir")
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_JSON_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SHARED_DIR_FIELD_NUMBER: _ClassVar[int]
    worker_name: str
    host: str
    pid: int
    resources_json: str
    peer_address: str
    shared_dir: str
    def __init__(self, worker_name: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., resources_json: _Optional[str] = ..., peer_address: _Optional[str] = ..., shared_dir: _Optional[str] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("worker_id", "program", "program_config_json", "heartbeat_interval_s", "float16_wire", "shared")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    FLOAT16_WIRE_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    program: str
    program_config_json: str
    heartbeat_interval_s: float
    float16_wire: bool
    shared: bool
    def __init__(self, worker_id: _Optional[str] = ..., program: _Optional[str] = ..., program_config_json: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., float16_wire: _Optional[bool] = ..., shared: _Optional[bool] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "status_json")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_JSON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    status_json: str
    def __init__(self, worker_id: _Optional[str] = ..., status_json: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ("known", "round")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    known: bool
    round: int
    def __init__(self, known: _Optional[bool] = ..., round: _Optional[int] = ...) -> None: ...

class TaskRequest(_message.Message):
    __slots__ = ("worker_id", "versions", "layout_version")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_VERSION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    versions: _containers.ScalarMap[str, int]
    layout_version: int
    def __init__(self, worker_id: _Optional[str] = ..., versions: _Optional[_Mapping[str, int]] = ..., layout_version: _Optional[int] = ...) -> None: ...

class Shard(_message.Message):
    __slots__ = ("index", "uri")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    index: int
    uri: str
    def __init__(self, index: _Optional[int] = ..., uri: _Optional[str] = ...) -> None: ...

class TaskHeader(_message.Message):
    __slots__ = ("kind", "step", "phase", "info_json", "shards", "seed", "versions", "round", "reducers", "part", "reduce_shards", "gathered", "gathered_round", "gathered_parts", "layout_version", "columns", "shard_reducers", "rows_kept", "rows_round", "ahead_info_json", "combine")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        RUN: _ClassVar[TaskHeader.Kind]
        DONE: _ClassVar[TaskHeader.Kind]
        WAIT: _ClassVar[TaskHeader.Kind]
    RUN: TaskHeader.Kind
    DONE: TaskHeader.Kind
    WAIT: TaskHeader.Kind
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class GatheredEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    REDUCERS_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    REDUCE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    GATHERED_FIELD_NUMBER: _ClassVar[int]
    GATHERED_ROUND_FIELD_NUMBER: _ClassVar[int]
    GATHERED_PARTS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_VERSION_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    SHARD_REDUCERS_FIELD_NUMBER: _ClassVar[int]
    ROWS_KEPT_FIELD_NUMBER: _ClassVar[int]
    ROWS_ROUND_FIELD_NUMBER: _ClassVar[int]
    AHEAD_INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    COMBINE_FIELD_NUMBER: _ClassVar[int]
    kind: TaskHeader.Kind
    step: int
    phase: str
    info_json: str
    shards: _containers.RepeatedCompositeFieldContainer[Shard]
    seed: int
    versions: _containers.ScalarMap[str, int]
    round: int
    reducers: _containers.RepeatedCompositeFieldContainer[Reducer]
    part: int
    reduce_shards: _containers.RepeatedScalarFieldContainer[int]
    gathered: _containers.ScalarMap[str, int]
    gathered_round: int
    gathered_parts: int
    layout_version: int
    columns: int
    shard_reducers: _containers.RepeatedScalarFieldContainer[int]
    rows_kept: _containers.RepeatedScalarFieldContainer[str]
    rows_round: int
    ahead_info_json: str
    combine: bool
    def __init__(self, kind: _Optional[_Union[TaskHeader.Kind, str]] = ..., step: _Optional[int] = ..., phase: _Optional[str] = ..., info_json: _Optional[str] = ..., shards: _Optional[_Iterable[_Union[Shard, _Mapping]]] = ..., seed: _Optional[int] = ..., versions: _Optional[_Mapping[str, int]] = ..., round: _Optional[int] = ..., reducers: _Optional[_Iterable[_Union[Reducer, _Mapping]]] = ..., part: _Optional[int] = ..., reduce_shards: _Optional[_Iterable[int]] = ..., gathered: _Optional[_Mapping[str, int]] = ..., gathered_round: _Optional[int] = ..., gathered_parts: _Optional[int] = ..., layout_version: _Optional[int] = ..., columns: _Optional[int] = ..., shard_reducers: _Optional[_Iterable[int]] = ..., rows_kept: _Optional[_Iterable[str]] = ..., rows_round: _Optional[int] = ..., ahead_info_json: _Optional[str] = ..., combine: _Optional[bool] = ...) -> None: ...

class Reducer(_message.Message):
    __slots__ = ("worker_id", "address")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "data", "last", "narrowed", "shared_file")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    NARROWED_FIELD_NUMBER: _ClassVar[int]
    SHARED_FILE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    data: bytes
    last: bool
    narrowed: bool
    shared_file: str
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ..., narrowed: _Optional[bool] = ..., shared_file: _Optional[str] = ...) -> None: ...

class TaskChunk(_message.Message):
    __slots__ = ("header", "tensors")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    header: TaskHeader
    tensors: _containers.RepeatedCompositeFieldContainer[TensorChunk]
    def __init__(self, header: _Optional[_Union[TaskHeader, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[TensorChunk, _Mapping]]] = ...) -> None: ...

class ShardResult(_message.Message):
    __slots__ = ("index", "samples", "metrics_json")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    index: int
    samples: int
    metrics_json: str
    def __init__(self, index: _Optional[int] = ..., samples: _Optional[int] = ..., metrics_json: _Optional[str] = ...) -> None: ...

class UpdateHeader(_message.Message):
    __slots__ = ("worker_id", "step", "results", "compute_s", "round", "scattered", "reduced", "part", "undelivered", "exchange_error", "combined")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SCATTERED_FIELD_NUMBER: _ClassVar[int]
    REDUCED_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    UNDELIVERED_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_ERROR_FIELD_NUMBER: _ClassVar[int]
    COMBINED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    step: int
    results: _containers.RepeatedCompositeFieldContainer[ShardResult]
    compute_s: float
    round: int
    scattered: bool
    reduced: bool
    part: int
    undelivered: _containers.RepeatedScalarFieldContainer[str]
    exchange_error: str
    combined: bool
    def __init__(self, worker_id: _Optional[str] = ..., step: _Optional[int] = ..., results: _Optional[_Iterable[_Union[ShardResult, _Mapping]]] = ..., compute_s: _Optional[float] = ..., round: _Optional[int] = ..., scattered: _Optional[bool] = ..., reduced: _Optional[bool] = ..., part: _Optional[int] = ..., undelivered: _Optional[_Iterable[str]] = ..., exchange_error: _Optional[str] = ..., combined: _Optional[bool] = ...) -> None: ...

class UpdateChunk(_message.Message):
    __slots__ = ("header", "tensors")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    header: UpdateHeader
    tensors: _containers.RepeatedCompositeFieldContainer[TensorChunk]
    def __init__(self, header: _Optional[_Union[UpdateHeader, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[TensorChunk, _Mapping]]] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("accepted", "reason")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("update", "next")
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    update: UpdateChunk
    next: TaskRequest
    def __init__(self, update: _Optional[_Union[UpdateChunk, _Mapping]] = ..., next: _Optional[_Union[TaskRequest, _Mapping]] = ...) -> None: ...

class SyncReply(_message.Message):
    __slots__ = ("pushed", "task", "fetch")
    PUSHED_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    pushed: PushReply
    task: TaskChunk
    fetch: bool
    def __init__(self, pushed: _Optional[_Union[PushReply, _Mapping]] = ..., task: _Optional[_Union[TaskChunk, _Mapping]] = ..., fetch: _Optional[bool] = ...) -> None: ...

class DataErrorReport(_message.Message):
    __slots__ = ("worker_id", "step", "shard", "message")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    step: int
    shard: int
    message: str
    def __init__(self, worker_id: _Optional[str] = ..., step: _Optional[int] = ..., shard: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class DataErrorReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SliceHeader(_message.Message):
    __slots__ = ("kind", "round", "part", "sender", "results")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UPDATE: _ClassVar[SliceHeader.Kind]
        REDUCED: _ClassVar[SliceHeader.Kind]
    UPDATE: SliceHeader.Kind
    REDUCED: SliceHeader.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    kind: SliceHeader.Kind
    round: int
    part: int
    sender: str
    results: _containers.RepeatedCompositeFieldContainer[ShardResult]
    def __init__(self, kind: _Optional[_Union[SliceHeader.Kind, str]] = ..., round: _Optional[int] = ..., part: _Optional[int] = ..., sender: _Optional[str] = ..., results: _Optional[_Iterable[_Union[ShardResult, _Mapping]]] = ...) -> None: ...

class TensorMeta(_message.Message):
    __slots__ = ("name", "dtype", "shape", "narrowed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NARROWED_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    narrowed: bool
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., narrowed: _Optional[bool] = ...) -> None: ...

class SliceBatch(_message.Message):
    __slots__ = ("header", "tensors")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    header: SliceHeader
    tensors: _containers.RepeatedCompositeFieldContainer[TensorMeta]
    def __init__(self, header: _Optional[_Union[SliceHeader, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[TensorMeta, _Mapping]]] = ...) -> None: ...

class SliceReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
