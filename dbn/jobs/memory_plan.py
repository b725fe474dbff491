"""How much memory a DBN worker needs, and whether its data must stream from local disk.

A worker holding its shards in memory keeps, per shard of ``r`` rows and ``d`` features:
the features as float32 (``4 r d``), the input of the layer being trained and, while
it is computed, the one below (``4 r (h[l-1] + h[l])`` at most, for hidden layers
``h``), the labels (``8 r``) and, while the data is checked, a mask of one byte a
value (``r d``); the Parquet file is read into the features a block at a time. A
streaming worker (``[cluster] stream``)
keeps only the labels of its rows, a few blocks of :data:`~dbn.model.minibatch.CHUNK_ROWS`
rows in flight, and its copy of the data on local disk. Both need the model (its
parameters, momentum, gradients and the copy received from the master; where the workers
reduce among themselves, also the parts of the updates it sends and receives, and the next
step's parameters and update computed ahead: :func:`model_bytes`) and the process itself
(Python, NumPy, pyarrow, gRPC: :data:`PROCESS_BYTES`, measured).

The launchers (the local mini-cluster and ``dbn submit``) call :func:`plan` before
starting any worker: it says whether the workers stream and refuses a job whose
workers cannot fit, naming the setting to change.
"""

from __future__ import annotations

import math

from ..errors import ConfigError
from ..model.minibatch import CHUNK_ROWS, PREFETCH_DEPTH

#: A worker process before any data: Python, NumPy, pyarrow, gRPC, compiled kernels (measured: 300 MiB).
PROCESS_BYTES = 320 * 2**20
#: Streaming is chosen ("auto") once holding the data would take more than this share of the budget.
STREAM_ABOVE = 0.8
STREAM_CHOICES = ("auto", "always", "never")
MiB = 2**20


def _weights(features: int, hidden_layers) -> int:
    sizes = [features, *hidden_layers]
    return sum(a * b + a + b for a, b in zip(sizes, sizes[1:]))


#: copies of the model's arrays a worker holds at most: parameters, momentum, gradients or steps, the copy
#: received; with ``exchange`` (the workers reduce, iterreduce.transport.exchange) four more: its update's parts on
#: their way to the reducers, the rows it reduces, and, running ahead (Program.runs_ahead), the next
#: step's parameters and update while this step's are still held
MODEL_COPIES = {False: 4, True: 8}


def model_bytes(features: int, hidden_layers, *, exchange: bool = False) -> int:
    """The model's arrays in a worker, in float32: :data:`MODEL_COPIES` of its weights and biases."""
    return MODEL_COPIES[exchange] * 4 * _weights(features, hidden_layers)


def check_one_process(rows: int, features: int, hidden_layers, *, available_bytes: int) -> None:
    """Refuse training in this process (its data loaded already) when the model and the layers'
    inputs would not fit in ``available_bytes`` (this machine's memory still free), naming the
    setting to change, instead of failing on an allocation part-way."""
    more = model_bytes(features, hidden_layers) + 4 * rows * _widest_pair(hidden_layers)
    if more > available_bytes:
        raise ConfigError(
            f"training {features}-{'-'.join(map(str, hidden_layers))} on {rows:,} rows in this process needs about "
            f"{math.ceil(more / MiB)} MiB more (the model: {math.ceil(model_bytes(features, hidden_layers) / MiB)} "
            f"MiB) but this machine has {available_bytes // MiB} MiB available: use smaller [model] hidden_layers, "
            f"fewer rows ([data] limit) or workers with streamed data (--local N, [cluster] stream)")


def _widest_pair(hidden_layers) -> int:
    """The most hidden units two consecutive layer inputs above the data hold at once."""
    inputs = list(hidden_layers[:-1])  # layer l's input is layer l-1's output
    pairs = [inputs[0]] if inputs else [0]
    pairs += [a + b for a, b in zip(inputs, inputs[1:])]
    return max(pairs)


def shard_bytes(rows: int, features: int, hidden_layers, *, stream: bool = False) -> int:
    """Memory one shard takes in a worker (see the module docstring)."""
    if stream:
        block = CHUNK_ROWS * (features + max(hidden_layers)) * 4
        return 8 * rows + (PREFETCH_DEPTH + 2) * block
    return rows * (4 * features + 4 * _widest_pair(hidden_layers) + 8 + features)


def worker_bytes(shards: list[dict], workers: int, hidden_layers, *, stream: bool, exchange: bool = False) -> int:
    """The most memory any of ``workers`` workers needs for ``shards`` (:func:`shardio.readers.shard_info`
    entries, dealt out in turn as the runtime does); ``exchange``: they reduce among themselves."""
    per_worker: list[int] = [0] * max(1, min(workers, len(shards)))
    for i, shard in enumerate(shards):
        per_worker[i % len(per_worker)] += shard_bytes(shard["rows"], shard["features"], hidden_layers, stream=stream)
    return PROCESS_BYTES + model_bytes(shards[0]["features"], hidden_layers, exchange=exchange) + max(per_worker)


def plan(shards: list[dict], workers: int, hidden_layers, *, choice: str, budget_bytes: int,
         budget_name: str, exchange: bool = False) -> tuple[bool, dict]:
    """Whether the workers stream their data, by ``choice`` ("auto", "always", "never") and
    the memory each may use (``budget_bytes``, the setting ``budget_name`` gives it); and the
    figures, for the log. ``exchange``: the workers reduce among themselves (``[cluster]
    reduce``). Raises :class:`ConfigError` naming the settings to change when the workers
    cannot fit."""
    memory = worker_bytes(shards, workers, hidden_layers, stream=False, exchange=exchange)
    streamed = worker_bytes(shards, workers, hidden_layers, stream=True, exchange=exchange)
    stream = choice == "always" or (choice == "auto" and memory > STREAM_ABOVE * budget_bytes)
    need = streamed if stream else memory
    figures = {"stream": stream, "worker_bytes": need, "in_memory_bytes": memory, "budget_bytes": budget_bytes}
    model = PROCESS_BYTES + model_bytes(shards[0]["features"], hidden_layers, exchange=exchange)
    if model > budget_bytes:  # more workers would not help: each holds the whole model
        raise ConfigError(
            f"the model alone ({shards[0]['features']}-{'-'.join(map(str, hidden_layers))}: "
            f"{_weights(shards[0]['features'], hidden_layers):,} weights) needs about {math.ceil(model / MiB)} MiB in "
            f"each worker ({MODEL_COPIES[exchange]} copies: parameters, momentum, steps, the master's copy"
            f"{' and the exchange' if exchange else ''}) but {budget_name} gives it "
            f"{budget_bytes // MiB} MiB: use smaller [model] hidden_layers or raise {budget_name}")
    if need > budget_bytes:
        hint = (f"raise {budget_name}" + (", set [cluster] stream = \"auto\" to stream the data from local disk"
                                          if not stream else "") + f" or use more than {workers} workers")
        raise ConfigError(
            f"each worker needs about {math.ceil(need / MiB)} MiB "
            f"({'streaming its data' if stream else 'holding its data in memory'}) but {budget_name} gives it "
            f"{budget_bytes // MiB} MiB: {hint}")
    return stream, figures
