"""What an iterative algorithm must say to run on IterativeReduce.

The runtime knows nothing of any model. A program describes:

- on the master: its initial parameters (named NumPy arrays), its schedule of
  supersteps, and how to reduce the workers' updates (by default the average
  weighted by sample count);
- on a worker: how to turn one data shard, the current parameters and a seed into
  an update for one superstep.

The runtime reads no data itself: a program names its :class:`Reader` (:attr:`Program.reader`),
which lists and describes the shards, and its worker half loads each one
(:meth:`WorkerProgram.load_shard`); the runtime only passes URIs and what the reader said.

The shard, not the worker, is the unit of data parallelism: a worker computes one
update per shard it holds, and seeds derive from (job seed, step, shard). So the
result does not depend on which worker process ran which shard, which is what
makes a resumed run bit-identical and lets a lost worker's shards move.
"""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np


Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class Step:
    """One superstep of a program's schedule.

    ``phase`` names the stage (e.g. "pretrain/1"); ``info`` is JSON-friendly detail
    for the worker (epoch, minibatch range); ``arrays`` names the parameters the
    step trains: workers send back only those, and the master reduces only those.
    """

    phase: str
    info: Mapping[str, Any] = field(default_factory=dict)
    arrays: tuple[str, ...] = ()


@dataclass
class Update:
    """A worker's result for one shard in one superstep."""

    shard: int
    samples: int
    arrays: Arrays = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    #: The other shards this update stands for (:meth:`WorkerProgram.run_combined`): it carries
    #: their samples and metrics with its own, its arrays the sample-weighted mean of them all.
    combined: tuple[int, ...] = ()


class Reader(ABC):
    """A program's data format, as the runtime sees it: which shards a URI holds and what each
    holds, read cheaply. Errors are :class:`~iterreduce.exceptions.DataError`\\ s naming the shard."""

    @abstractmethod
    def list_shards(self, uri: str) -> list[str]:
        """URIs of the shards in folder ``uri`` (or ``uri`` itself, one shard), in a fixed order."""

    @abstractmethod
    def describe(self, uris: list[str]) -> list[dict]:
        """Each shard's ``{"uri", "rows", "features", "labels", "ranges", ...}``, without reading its
        rows; refuses a shard that is unusable already by what it says of itself."""


class Program(ABC):
    """Master-side half of an iterative algorithm. ``config`` is a JSON-friendly dict."""

    #: import path of the :class:`WorkerProgram` subclass that pairs with this program
    worker_class: str = ""

    #: import path of the :class:`Reader` of the program's shards (the launchers list a folder of
    #: shards with it, the master describes them with it)
    reader: str = ""

    #: Set True when :meth:`reduce` is elementwise: each row (index on axis 0) of each array it
    #: returns depends only on the same row of the updates and of the parameters it reads (the
    #: step's arrays and the master-only ones; no others), so that run on rows ``a:b`` of every
    #: array it returns rows ``a:b`` of every result, with the same bits (sums in shard order,
    #: elementwise NumPy). The workers may then reduce among themselves,
    #: each its own rows (``MasterConfig.reduce = "workers"``, :mod:`iterreduce.transport.exchange`). The
    #: default reduce is; an overriding one is taken not to be unless it says so.
    elementwise_reduce: bool = False

    #: Set True when a step is complete only with every shard's update (a map over the data, such
    #: as scoring it): a lost worker's unfinished shards are then done within the step by the
    #: workers they move to, never skipped. The default suits training: the step goes on
    #: without them (their shards sit out until their worker is back or they have moved).
    every_shard_every_step: bool = False

    def __init__(self, config: Mapping[str, Any]):
        self.config = dict(config)

    @abstractmethod
    def initial_parameters(self, seed: int, shards: list[dict]) -> Arrays:
        """Parameters before the first superstep.

        ``shards`` describes each shard: ``{"uri", "rows", "features", "labels", "ranges"}``.
        """

    def check_shards(self, shards: list[dict]) -> dict:
        """Refuse data this program cannot use, before any training: raise
        :class:`~iterreduce.exceptions.DataError` naming the shard. ``shards`` as for
        :meth:`initial_parameters`, plus ``ranges``, the smallest and largest feature value
        and label from the footers (:func:`shardio.shards.footer_ranges`). Returns facts
        about the data for the log's ``data`` event (e.g. class counts; ``rows`` replaces the
        stored rows the master counted, where the program read how many it trains on); default: none."""
        return {}

    @abstractmethod
    def schedule(self, shards: list[dict]) -> Iterator[Step]:
        """Every superstep in order; the same sequence each time it is called."""

    def before_step(self, step: Step, parameters: Arrays) -> Arrays:
        """Master-side hook run before each step (e.g. derive new arrays); default: no change."""
        return parameters

    def finalize(self, parameters: Arrays, output_dir: str) -> None:
        """Write the result after the last step; default: the parameters as ``parameters.npz``
        (a new file renamed in, :func:`iterreduce.storage.durable.write_local`)."""
        from .storage.durable import write_local  # here: a program's workers need none of durable's pyarrow

        write_local(f"{output_dir}/parameters.npz", lambda f: np.savez(f, **parameters))

    def commit(self, output: str) -> None:
        """Make the job's result visible once the master's outputs are all at ``output`` (the
        job's output URI): called once, after a successful run, by the launcher (e.g. rename a
        staging folder into place). Default: nothing, the outputs are the result."""

    def reduce(self, step: Step, parameters: Arrays, updates: list[Update]) -> Arrays:
        """New values of ``step.arrays``: by default the sample-weighted mean of the updates.

        Updates arrive sorted by shard, so the sum order (and the floats) never
        depend on timing.
        """
        return weighted_average(updates, step.arrays)

    def averages(self, step: Step) -> bool:
        """Whether :meth:`reduce` of ``step`` reads the updates only through their sample-weighted
        mean (:func:`weighted_average` of ``step.arrays``; what it then computes from the mean and
        the parameters is its own, e.g. :func:`block_momentum_average`). Then a worker holding several
        shards may push one update for them, their mean (:attr:`MasterConfig.combine
        <iterreduce.master.config.MasterConfig.combine>`). Default: whether :meth:`reduce` is this class's."""
        return type(self).reduce is Program.reduce

    def reduces_elementwise(self) -> bool:
        """Whether :meth:`reduce` may run on rows of the arrays (see :attr:`elementwise_reduce`)."""
        return type(self).reduce is Program.reduce or self.elementwise_reduce

    def runs_ahead(self, step: Step, following: Step) -> bool:
        """Whether a worker may compute its update for ``following`` as soon as the workers'
        reduce of ``step`` gives it the new parameters, while the master still ends ``step``
        (its bookkeeping then overlaps the compute instead of adding to every sync). The update is
        kept only when the task that comes is ``following`` with no parameter the master changed
        (:meth:`before_step`, :meth:`after_step`), so the bits never depend on it; else it is
        computed again. Say True only where the worker program's run of ``following`` keeps
        nothing that a run with other parameters would make differently. Default: never."""
        return False

    def evaluate(self, step: Step, parameters: Arrays) -> dict:
        """Metrics the master measures itself after a superstep (e.g. a validation error),
        merged into its progress record; by default none."""
        return {}

    def after_step(self, step: Step, parameters: Arrays, metrics: dict) -> Arrays:
        """Master-side bookkeeping once a step is reduced and evaluated (``metrics``: what
        :meth:`evaluate` measured), e.g. keeping the best parameters for early stopping: returns
        the parameters with arrays named :data:`MASTER_STATE` ``+ ...`` added or replaced (they are
        checkpointed, so a resumed job goes on with them). Default: no change."""
        return parameters

    def finished(self, parameters: Arrays) -> bool:
        """Whether the job ends before its schedule does (e.g. early stopping), judged from the
        parameters (so also right after a resume); checked after every step. Default: never."""
        return False

    def observe(self, record: dict) -> None:
        """Each record the master writes to the job's log (step records and events), as it is
        written: a program may pass them on (e.g. to a tracking server). Called on the master
        alone (workers make programs too, to reduce), the first time with the job's first record;
        it must not block: the master calls it between steps. Default: nothing."""

    def links(self) -> dict[str, str]:
        """Where the job is shown beyond its own page, once known (``{name: URL}``, e.g. a run on a
        tracking server): the master logs them when they change, the live page and ``status`` show
        them. Default: none."""
        return {}

    def close(self, succeeded: bool, output_dir: str) -> None:
        """The job ended (``succeeded``, or failed or stopped); ``output_dir`` holds the master's
        files. Called once, last, on the master's side; an error here is logged, never the job's.
        Default: nothing."""

    def view(self) -> dict | None:
        """What the job's live page draws: a view spec (see :mod:`iterreduce.webui.snapshot`:
        its title, charts of the step records' metrics, image names and titles). Default
        None: one chart per numeric metric of the step records."""
        return None

    def images(self, parameters: Arrays) -> dict[str, np.ndarray]:
        """Images for the live page drawn from the current parameters: ``{name: 2-D array}``
        (uint8 grey levels, or any numbers, scaled from their min..max); names as in
        :meth:`view`. Called from the page's server thread: read ``parameters``, never change
        them. Default: none."""
        return {}

    def summarize(self, step: Step, updates: list[Update]) -> dict:
        """Progress record for one superstep: by default sample-weighted metric means."""
        return {"samples": sum(u.samples for u in updates), **weighted_metrics(updates)}


class WorkerProgram(ABC):
    """Worker-side half: computes updates on the shards a worker holds."""

    def __init__(self, config: Mapping[str, Any], device: str = "cpu"):
        self.config = dict(config)
        self.device = device

    @abstractmethod
    def load_shard(self, uri: str, index: int):
        """This worker's copy of shard ``index`` at ``uri``, in whatever form :meth:`run` takes it (read
        whole into memory, or streamed to local disk where the data may not fit)."""

    @abstractmethod
    def run(self, step: Step, parameters: Arrays, shard, seed: int) -> Update:
        """Compute this shard's update for ``step`` from ``parameters``.

        ``shard`` is what :meth:`load_shard` returned for it.
        Raise :class:`~iterreduce.exceptions.DataError` for data that cannot be used: the
        job then stops with its message (it is not retried in a new process).
        """

    def run_shards(self, step: Step, parameters: Arrays, shards: list, seeds: list[int]) -> list[Update]:
        """This worker's updates of ``step`` for several of its shards (``seeds``: each one's), in
        their order. Default: :meth:`run` on each in turn. A program may run them as one
        computation (batched on one device), as long as each shard gets the update its own
        :meth:`run` gives: the master sees the same updates either way."""
        return [self.run(step, parameters, shard, seed) for shard, seed in zip(shards, seeds)]

    def run_combined(self, step: Step, parameters: Arrays, shards: list, seeds: list[int]) -> Update:
        """One update standing for this worker's updates of ``step`` on several shards (as
        :func:`combine_updates` makes it), where the master asked for one (its program's reduce reads
        only their mean: :meth:`Program.averages`). Default: :func:`combine_updates` of
        :meth:`run_shards`; a program holding the shards' results on a device may average them there
        and copy one update to the host instead of one a shard."""
        return combine_updates(self.run_shards(step, parameters, shards, seeds), step.arrays)


#: Elements of each array the reduces below work on at a time: their float64 temporaries stay in
#: the cache (on 13 MB of updates about three times faster than whole arrays), and each element
#: sees the same operations in the same order, so the bits are those of whole arrays.
REDUCE_BLOCK = 1 << 15


def _blocks(size: int):
    """Slices of :data:`REDUCE_BLOCK` elements covering ``size``."""
    for start in range(0, size, REDUCE_BLOCK):
        yield slice(start, min(size, start + REDUCE_BLOCK))


def weighted_average(updates: list[Update], names) -> Arrays:
    """Sample-weighted mean of the named arrays over ``updates``, summed in float64 in shard
    order (the same bits whatever order the updates arrived in)."""
    updates = [u for u in updates if u.samples > 0]
    if not updates:
        raise ValueError("no update with samples to average")
    total = float(sum(u.samples for u in updates))
    ordered = sorted(updates, key=lambda u: u.shard)
    result = {}
    for name in names:
        like = updates[0].arrays[name]
        flats = [(u.samples / total, np.asarray(u.arrays[name]).reshape(-1)) for u in ordered]
        out = np.empty(like.size, dtype=like.dtype)
        for block in _blocks(like.size):
            acc = np.zeros(block.stop - block.start, dtype=np.float64)
            for weight, flat in flats:
                acc += weight * flat[block]
            out[block] = acc.astype(like.dtype)
        result[name] = out.reshape(like.shape)
    return result


def combine_updates(updates: list[Update], names, average=None) -> Update:
    """One update for several shards' ``updates``: the arrays ``names`` their sample-weighted mean
    (``average(updates, names)``, by default :func:`weighted_average`; a program may pass its own,
    e.g. made on a device, returning host arrays), the samples summed, each numeric metric their
    sample-weighted mean (as :meth:`Program.summarize` weighs them), named after the first shard.

    The master's average of combined updates differs from its average of the shards' own updates
    by at most 4.5 float32 ulps of the largest of the shards' values at each element (each weighted
    term rounds to float32, and a group's mean rounds once more before the master weighs it; 1.5
    measured, ``tests/test_combine.py``). So the last bits then depend on which shards each worker held."""
    ordered = sorted(updates, key=lambda u: u.shard)
    total = sum(u.samples for u in ordered)
    first = ordered[0]
    # Without samples the master ignores the update (weighted_average): any arrays of the right shape do.
    arrays = (average or weighted_average)(ordered, names) if total else {name: first.arrays[name] for name in names}
    return Update(first.shard, total, arrays, weighted_metrics(ordered), combined=tuple(u.shard for u in ordered[1:]))


def weighted_metrics(updates: list[Update]) -> dict:
    """Each numeric metric of ``updates``, their sample-weighted mean (NaN where none has samples)."""
    metrics = {}
    for key in sorted({k for u in updates for k, v in u.metrics.items() if isinstance(v, (int, float))}):
        weighted = [(u.metrics[key], u.samples) for u in updates if isinstance(u.metrics.get(key), (int, float))]
        weight = sum(w for _, w in weighted)
        metrics[key] = sum(v * w for v, w in weighted) / weight if weight else float("nan")
    return metrics


MASTER_ONLY = "master."  # parameters with this prefix stay on the master (checkpointed, never sent)
#: The program's own bookkeeping on the master (:meth:`Program.after_step`, e.g. the best
#: parameters so far): checkpointed, never sent, and never read by a reduce.
MASTER_STATE = "master-state."


def master_side(name: str) -> bool:
    """Whether parameter ``name`` stays on the master (:data:`MASTER_ONLY`, :data:`MASTER_STATE`)."""
    return name.startswith(MASTER_ONLY) or name.startswith(MASTER_STATE)


def block_momentum_average(parameters: Arrays, updates: list[Update], names, momentum: float,
                           plain=(), block_learning_rate: float = 1.0, nesterov: bool = False) -> Arrays:
    """Average, then move by a momentum over the per-sync deltas (BMUF, Chen & Huo 2016).

    Averaging N workers' k local steps makes about k steps of an N-times larger batch
    per sync: N-fold fewer sequential updates than one process. BMUF restores the pace:
    ``delta = momentum * delta_prev + block_learning_rate * (mean - current)``, then
    ``current += delta``. Block momentum ``m`` (about 1 - 1/N) does it in the steady state,
    after about 1/(1 - m) syncs; a block learning rate above 1 scales every sync's step
    at once. With ``nesterov`` the workers start from the look-ahead point, the new
    parameters plus ``momentum * delta`` (BMUF's Nesterov variant: the extrapolation
    includes this sync's progress). The previous delta is kept as a master-only array.
    Names in ``plain`` (e.g. optimizer state) are only averaged. ``momentum=0`` and
    ``block_learning_rate=1`` is the plain weighted average.
    """
    mean = weighted_average(updates, names)
    if not momentum and block_learning_rate == 1:
        return mean
    result = {}
    for name in names:
        if name in plain:
            result[name] = mean[name]
            continue
        key = f"{MASTER_ONLY}block_delta.{name}"
        current = np.asarray(parameters[name])
        previous = parameters.get(key) if momentum else None
        flat_mean, flat_current = mean[name].reshape(-1), current.reshape(-1)
        flat_previous = None if previous is None else np.asarray(previous).reshape(-1)
        moved_out = np.empty(current.size, dtype=current.dtype)
        delta_out = np.empty(current.size, dtype=np.float32) if momentum else None
        for block in _blocks(current.size):  # elementwise, a block at a time (see REDUCE_BLOCK)
            delta = block_learning_rate * (flat_mean[block].astype(np.float64) - flat_current[block])
            if flat_previous is not None:
                delta += momentum * flat_previous[block]
            if momentum:
                delta_out[block] = delta.astype(np.float32)
            moved = flat_current[block] + delta
            if nesterov and momentum:  # current was the last look-ahead point: current + momentum * previous
                moved += momentum * (delta if flat_previous is None else delta - flat_previous[block])
            moved_out[block] = moved.astype(current.dtype)
        if momentum:
            result[key] = delta_out.reshape(current.shape)
        result[name] = moved_out.reshape(current.shape)
    return result


def shard_seed(job_seed: int, step: int, shard: int) -> int:
    """The seed of one shard's computation in one step: independent of which worker runs it."""
    return int(np.random.SeedSequence([job_seed, step, shard]).generate_state(1)[0])


def load_class(path: str):
    """Import ``"package.module:Class"``."""
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"program path {path!r} must look like 'package.module:Class'")
    return getattr(importlib.import_module(module), name)


def reader_of(program: str) -> Reader:
    """The :class:`Reader` that the program at import path ``program`` names."""
    program_cls = load_class(program)
    if not program_cls.reader:
        raise ValueError(f"program {program!r} names no reader of its shards (its class attribute 'reader')")
    return load_class(program_cls.reader)()


def step_to_json(step: Step) -> str:
    """A step as the JSON text the master sends to workers (and fingerprints a job with)."""
    return json.dumps({"phase": step.phase, "info": dict(step.info), "arrays": list(step.arrays)})


def step_from_json(text: str) -> Step:
    """The step :func:`step_to_json` wrote."""
    d = json.loads(text)
    return Step(d["phase"], d["info"], tuple(d["arrays"]))
