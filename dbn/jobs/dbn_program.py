"""The DBN as an IterativeReduce program: the phases of PayPal's system on our runtime.

Schedule, for each layer l: ``transform`` (each worker turns its own shard into
layer l's input locally, no data moves, and reports the input's mean, from which
the master sets the visible biases), then ``pretrain`` supersteps (one per epoch,
or one per ``sync_every`` minibatches); then ``finetune`` supersteps of backprop.

Reduce: the sample-weighted mean of parameters *and* momentum increments. Averaging
the increments (rather than resetting them at each synchronisation) keeps the
optimizer's state continuous, so with a sync every minibatch and equal shards the
run follows single-machine momentum SGD; it doubles the bytes on the wire, which
``float16_wire`` can halve again.
"""

from __future__ import annotations

import atexit
import math
import shutil
import tempfile
from pathlib import Path

import numpy as np

from dbn.model.scaler import FeatureStats
from iterreduce.program import (MASTER_STATE, Program, Step, Update, WorkerProgram, block_momentum_average, combine_updates,
                                master_side, weighted_average)
from iterreduce.storage.rowfile import RowFile, local_directory
from shardio.readers import read_labels, read_shard, same_classes, shard_classes, shard_info, spill_shard

from ..data.scaling import STATS, gathered_scaler, merge_stats_arrays, stats_arrays
from ..data.table_data import attach_inputs
from ..data.validation import UNIT_INTERVAL_HINT, check_features, check_labels, class_warnings, minibatch_warnings
from ..errors import DataError
from ..model import state
from ..model.backend import get_backend
from ..model.divergence import check_arrays
from ..model.estimator import DBN, layer_seed
from ..model.minibatch import CHUNK_ROWS, chunks, column_mean
from ..model.network import Network
from ..model.network_group import NetworkGroup
from ..model.rbm import RBM
from ..model.rbm_group import GroupError, RBMGroup
from . import view
from .tracking import LINK_NAME, master_tracker


def dbn_params(config) -> dict:
    """The :class:`DBN` hyperparameters in a program config: the keys of its signature, less
    ``device`` (each process picks its own) and ``callback`` (none in a distributed job)."""
    names = set(DBN().get_params()) - {"device", "callback"}
    return {k: v for k, v in config.items() if k in names}


#: Early stopping's state on the master (see DBNProgram.after_step)
BEST, BEST_ERROR = f"{MASTER_STATE}best.", f"{MASTER_STATE}best_valid_error"
SINCE_BEST, STOP = f"{MASTER_STATE}epochs_since_best", f"{MASTER_STATE}stop"


#: The phases whose steps train a model on each shard (the others describe or transform the data).
TRAINING_PHASES = ("pretrain", "finetune")


class DBNProgram(Program):
    """Master side. ``config`` (:meth:`dbn.jobs.spec.JobSpec.program_config` makes it): DBN
    hyperparameters (see :class:`dbn.DBN`) plus ``n_classes`` (None: counted from the labels),
    ``seed``, ``sync_every`` (minibatches per synchronisation; 0 or absent = once per epoch, the
    paper's setting), the block momentum of fine-tuning and of pre-training (``block_momentum``,
    ``pretrain_block_momentum``, ``block_nesterov``; 0 = plain averaging) and its step
    (``block_learning_rate``, ``pretrain_block_learning_rate``; see
    :func:`iterreduce.program.block_momentum_average`), ``validation`` (URI of a labelled shard
    for a validation error per fine-tuning epoch), ``stream`` (workers read their shards from
    local disk a block at a time) and ``scale`` (the scaler the workers' first step gathers:
    "min_max", "standard" or None).

    The parameters are the flat state of :mod:`dbn.model.state` (``rbm.{l}.*``, ``net.{i}.*``),
    plus the runtime's ``master.*`` arrays; before fine-tuning, ``net.{n}.weights`` holds the
    softmax layer's initial weights, drawn here so that every worker starts from the same ones."""

    worker_class = "dbn.jobs.dbn_program:DBNWorker"
    reader = "shardio.readers:ShardFiles"

    def __init__(self, config):
        super().__init__(config)
        self.model = DBN(**dbn_params(config), device="cpu").validate_params()
        self.layers = self.model.hidden_layers
        self.n_classes = config.get("n_classes")  # None: counted from the shards' labels by check_shards
        self._validation = None
        self._finetune_parts = 1
        self._classes = None  # the LabelMap of a table or of string labels (from the shards), kept with the model
        self._columns = None  # a table's feature columns (from its shares), kept with the model
        self._widths = None  # the features each of them gives
        # A YARN application master records the run in MLflow itself (dbn.jobs.tracking.master_settings),
        # from the first record it observes: workers make programs too (to reduce), and record nothing.
        self.tracker = None

    def _parts(self, shards, batch_size) -> int:
        sync = int(self.config.get("sync_every") or 0)
        most = max(s["rows"] // min(batch_size, s["rows"]) for s in shards)
        return 1 if not sync else math.ceil(most / sync)

    def _ranges(self, part: int, parts: int) -> list | None:
        sync = int(self.config.get("sync_every") or 0)
        return None if parts == 1 else [part * sync, (part + 1) * sync]

    def schedule(self, shards):
        m = self.model
        if self.config.get("scale"):  # a table's raw rows: first their statistics, for the scaler
            yield Step("stats", {}, STATS)
        parts = self._parts(shards, m.pretrain_batch_size)
        for layer in range(len(self.layers)):
            yield Step("transform", {"layer": layer}, (state.rbm_name(layer, "visible_bias"),))
            for epoch in range(m.pretrain_epochs):
                for part in range(parts):
                    yield Step("pretrain", {"layer": layer, "epoch": epoch, "part": part,
                                            "batches": self._ranges(part, parts)}, state.rbm_names(layer))
        parts = self._finetune_parts = self._parts(shards, m.finetune_batch_size)
        n = len(self.layers) + 1
        for epoch in range(m.finetune_epochs):
            top_only = epoch < m.top_layer_epochs
            learning_rate, momentum = m.finetune_schedule(epoch)
            for part in range(parts):
                yield Step("finetune", {
                    "epoch": epoch, "part": part, "batches": self._ranges(part, parts),
                    "learning_rate": learning_rate, "momentum": momentum,
                    "top_only": top_only,
                }, state.net_names(n, range(n - 1, n) if top_only else None))

    def check_shards(self, shards):
        """Refuse data this DBN cannot train on, by the footers (feature counts, labels, the
        value range Bernoulli units need) and the label columns (classes outside ``n_classes``);
        returns the class counts and warnings about rare classes for the log."""
        self._classes = shard_classes(shards)  # a table's or string labels' values, the same in every shard
        self._columns = shards[0].get("columns")  # one resolved source: every share of a table names the same
        self._widths = shards[0].get("widths")  # and gives the same features a column
        unlabelled = [s["uri"] for s in shards if not s["labels"]]
        if self.model.fine_tunes and unlabelled:
            raise DataError(f"{unlabelled[0]}: no 'label' column, but fine-tuning needs labels "
                            f"({len(unlabelled)} of {len(shards)} shards have none)")
        widths = {s["features"] for s in shards}
        if len(widths) != 1:
            first = {}
            for s in shards:
                first.setdefault(s["features"], s["uri"])
            raise DataError("shards disagree on the feature count: " +
                            ", ".join(f"{uri} has {width}" for width, uri in sorted(first.items())))
        if self.model.visible == "bernoulli" and not self.config.get("scale"):  # scaled rows are checked later
            for s in shards:
                lo, hi = (v + 0.0 for v in s["ranges"]["features"] or (0, 1))  # + 0.0: no "-0"
                if lo < 0 or hi > 1:
                    raise DataError(f"{s['uri']}: features range over [{lo:g}, {hi:g}] (the footer's statistics) "
                                    f"but Bernoulli visible units need [0, 1]: {UNIT_INTERVAL_HINT}")
        if self.config.get("validation"):  # scored after each fine-tuning epoch: check it now, not then
            (valid,) = shard_info([self.config["validation"]])
            if not valid["labels"] or valid["features"] != shards[0]["features"]:
                raise DataError(f"{valid['uri']}: the validation shard needs a 'label' column and "
                                f"{shards[0]['features']} features per row, as the training shards have")
            same_classes(valid, shards[0])
        rows = {s["uri"]: s["rows"] for s in shards}  # as stored; a table's filter may keep fewer
        if unlabelled:  # pre-training only: a placeholder output layer
            self.n_classes = 1
            return {"warnings": self._minibatch_warnings(rows, fine_tunes=False)}
        counts = np.zeros(self.config.get("n_classes") or 0, dtype=np.int64)
        for s in shards:
            labels = read_labels(s["uri"])  # of the rows the shard trains on: its table's filter applied
            labels = check_labels(labels, n_samples=labels.shape[0], n_classes=self.config.get("n_classes"),
                                  name=f"{s['uri']}: 'label'")
            rows[s["uri"]] = labels.shape[0]
            found = np.bincount(labels)
            counts = np.pad(counts, (0, max(0, found.size - counts.size)))
            counts[:found.size] += found
        known = 0 if self._classes is None else len(self._classes)
        self.n_classes = self.config.get("n_classes") or max(counts.size, known)
        return {"rows": sum(rows.values()), "classes": counts.tolist(),
                "warnings": class_warnings(counts, name="the shards' labels") + self._minibatch_warnings(rows)}

    def _minibatch_warnings(self, rows: dict[str, int], fine_tunes: bool = True) -> list[str]:
        """:func:`minibatch_warnings` for the smallest shard (``rows``: shard URI -> rows)."""
        uri = min(rows, key=rows.get)
        name = f"{uri} (the smallest of {len(rows)} shards)" if len(rows) > 1 else uri
        return minibatch_warnings(rows[uri], self.model, name=name, fine_tunes=fine_tunes)

    def initial_parameters(self, seed, shards):
        if self.n_classes is None:  # check_shards counts the classes (the master calls it first)
            self.check_shards(shards)
        sizes = [shards[0]["features"], *self.layers]
        params = {}
        for layer in range(len(self.layers)):
            rbm = self.model.make_rbm(layer, seed=layer_seed(seed, layer))  # from the job's seed
            rbm.initialize(n_visible=sizes[layer])
            params.update(state.named_rbm_state(layer, rbm.get_state()))
        rng = np.random.default_rng([seed, 99])
        softmax = 0.01 * rng.standard_normal((self.layers[-1], int(self.n_classes)))
        params[state.net_name(len(self.layers), "weights")] = softmax.astype(np.float32)
        if self.config.get("scale"):
            params.update({name: np.zeros(sizes[0]) for name in STATS})  # float64, filled by the first step
        return params

    def before_step(self, step, parameters):
        if step.phase == "finetune" and state.net_name(0, "weights") not in parameters:
            # Fine-tuning starts from the pre-trained stack plus the softmax layer drawn at the start.
            return {**parameters, **state.finetune_start(parameters, len(self.layers))}
        return parameters

    # The average, block momentum and the logit are all elementwise: the workers may reduce.
    elementwise_reduce = True

    def reduce(self, step, parameters, updates):
        if step.phase == "stats":
            return merge_stats_arrays([u.arrays for u in updates])
        if step.phase == "transform":
            # Workers report their input's mean; Bernoulli visible biases start at its logit.
            name = step.arrays[0]
            mean = weighted_average(updates, [name])[name]
            if step.info["layer"] == 0 and self.model.visible == "gaussian":
                return {name: np.zeros_like(mean)}
            return {name: state.logit(mean).astype(np.float32)}
        # Each phase has its own block momentum and rate: in CD pre-training a momentum above 0.7
        # compounded with the RBMs' own 0.9 and slowed convergence (MNIST, 10 workers, measured).
        prefix = "" if step.phase == "finetune" else "pretrain_"
        momentum = float(self.config.get(f"{prefix}block_momentum") or 0.0)
        rate = float(self.config.get(f"{prefix}block_learning_rate") or 1.0)
        increments = [name for name in step.arrays if state.is_increment(name)]
        return block_momentum_average(parameters, updates, step.arrays, momentum, plain=increments,
                                      block_learning_rate=rate, nesterov=bool(self.config.get("block_nesterov")))

    def averages(self, step):
        """Pre-training, fine-tuning and the input means reduce through the updates' mean alone
        (block momentum, the logit follow from it); the feature statistics merge (a worker's several
        shards stay several updates there)."""
        return step.phase == "transform" or step.phase in TRAINING_PHASES

    def runs_ahead(self, step, following):
        """A worker may compute the next pre-training part of the same layer, or the next fine-tuning
        part training the same arrays, before the master confirms it: such a run starts from the
        parameters it is given (the RBM's state and chain, or a new network) and keeps only the
        layer's input and the labels, the same whatever the parameters of the layer it trains."""
        return step.phase == following.phase in TRAINING_PHASES and step.arrays == following.arrays

    def evaluate(self, step, parameters):
        """Validation error after each fine-tuning epoch, when ``config["validation"]`` names
        a labelled shard (the master reads it once; it is never trained on)."""
        uri = self.config.get("validation")
        if not uri or step.phase != "finetune" or step.info.get("part", 0) != self._finetune_parts - 1:
            return {}
        if self._validation is None:
            self._validation = read_shard(uri, need_labels=True)
            scaler = gathered_scaler(parameters, self.config.get("scale"))  # raw rows, scaled as the training rows
            if scaler is not None:
                self._validation.features = scaler.transform(self._validation.features)
        net = Network.from_state(parameters, len(self.layers) + 1, self.model.backend)
        proba = net.predict_proba_device(self.model.backend.asarray(self._validation.features))
        predicted = self.model.backend.to_numpy(proba).argmax(axis=1)
        return {"valid_error": float(np.mean(predicted != self._validation.labels))}

    def after_step(self, step, parameters, metrics):
        """Stop a job whose training diverged (:mod:`dbn.model.divergence`: the arrays the step
        trained hold NaN or infinity). Then early stopping (``early_stopping_patience``, scored on
        ``validation``) as one process does it: after each fine-tuning epoch, the best network
        so far, the epochs since it, and whether to stop (never during the top-layer-only
        epochs), kept as master state."""
        trained = {name: parameters[name] for name in step.arrays}
        if trained and step.phase == "pretrain":
            layer = step.info["layer"]
            check_arrays(trained, "pretrain", step.info["epoch"], layer=layer, rate=self.model.pretrain_rates()[layer],
                         gaussian=layer == 0 and self.model.visible == "gaussian")
        elif trained and step.phase == "finetune":
            check_arrays(trained, "finetune", step.info["epoch"], rate=step.info["learning_rate"])
        patience = self.config.get("early_stopping_patience")
        if patience is None or "valid_error" not in metrics:
            return parameters
        kept, error = dict(parameters), metrics["valid_error"]
        if BEST_ERROR not in parameters or error < float(parameters[BEST_ERROR]):
            kept[BEST_ERROR], kept[SINCE_BEST] = np.array(error), np.array(0)
            kept.update({BEST + name: parameters[name].copy() for name in self._net_names()})
        else:
            kept[SINCE_BEST] = np.array(int(parameters[SINCE_BEST]) + 1)
        kept[STOP] = np.array(int(kept[SINCE_BEST]) >= patience and not step.info.get("top_only", False))
        return kept

    def finished(self, parameters):
        return bool(parameters.get(STOP, False))

    def _net_names(self) -> list[str]:
        return [state.net_name(i, key) for i in range(len(self.layers) + 1) for key in ("weights", "biases")]

    def finalize(self, parameters, output_dir):
        if self.config.get("early_stopping_patience") is not None and BEST_ERROR in parameters:
            parameters = {**parameters, **{name: parameters[BEST + name] for name in self._net_names()}}
        self.to_model(parameters).save(f"{output_dir}/model.npz")

    def observe(self, record):
        if self.tracker is None:
            self.tracker = master_tracker(self.config.get("mlflow"))
        self.tracker.record(record)

    def links(self):
        link = self.tracker and self.tracker.link
        return {LINK_NAME: link} if link else {}

    def close(self, succeeded, output_dir):
        if self.tracker is not None:
            self.tracker.finish(None, Path(output_dir), error=None if succeeded else RuntimeError("the job ended early"))

    def view(self):
        """The live page's curves (reconstruction error, fine-tuning loss and errors) and filters."""
        return view.view_spec(self.layers)

    def images(self, parameters):
        """The first layer's filters, as they are now."""
        image = view.filters_of(parameters)
        return {} if image is None else {view.FILTERS: image}

    def to_model(self, parameters) -> DBN:
        """The trained :class:`DBN` from the final parameters, with a table's classes and the
        scaler (when the job scales its data), so that it predicts from raw rows."""
        model = DBN(**dbn_params(self.config), device="cpu").set_state(
            {k: v for k, v in parameters.items() if k not in STATS and not master_side(k)})
        scaler = gathered_scaler(parameters, self.config.get("scale"))  # gathered by the workers in the first step
        return attach_inputs(model, self._classes, scaler, self._columns, self._widths)


class DBNWorker(WorkerProgram):
    """Worker side: trains RBM layers and the network on its shards.

    With ``config["stream"]`` a shard is copied to local disk (:func:`shardio.readers.spill_shard`)
    and every layer's input stays there, read a few minibatches ahead: a worker's memory then
    no longer grows with its data (see :mod:`dbn.jobs.memory_plan`). The rows, and so the model,
    are the same bits either way."""

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.model = DBN(**dbn_params(config), device=device).validate_params()
        self.layers = self.model.hidden_layers
        self.stream = bool(config.get("stream"))
        self._inputs: dict[tuple[int, int], object] = {}  # (shard, layer) -> that layer's input: device array or RowFile
        self._rbms: dict[tuple[int, int], RBM] = {}
        self._nets: dict[int, Network] = {}
        self._labels: dict[int, object] = {}
        self._spill_dir: str | None = None
        self._scaled_shards: set[int] = set()  # shards whose rows _scale has scaled in place
        self._group: RBMGroup | None = None  # the shards' RBMs of one layer trained as one computation
        self._net_group: NetworkGroup | None = None  # the shards' networks fine-tuned as one computation
        self._streams: list = []  # the group's members' dropout streams (each reseeded a step)

    def load_shard(self, uri, index):
        if not self.stream:
            return read_shard(uri, index)
        return spill_shard(uri, self._spill_directory(), index)

    def _spill_directory(self) -> str:
        """A private directory for this worker's row files on a local disk (YARN's first local
        directory for the container, else the temporary directory), removed at exit."""
        if self._spill_dir is None:
            self._spill_dir = tempfile.mkdtemp(prefix="dbn-rows-", dir=local_directory())
            atexit.register(shutil.rmtree, self._spill_dir, True)
        return self._spill_dir

    def _input(self, shard, layer: int, parameters):
        """Layer ``layer``'s input for ``shard``, computed locally from the layers below. Only
        the data (layer 0) and the newest layer's input are kept."""
        key = (shard.index, layer)
        if key not in self._inputs:
            if layer == 0:
                self._inputs[key] = self._checked_data(shard, parameters)
            else:
                below = self._rbm(shard, layer - 1)
                below.set_state(state.rbm_state(parameters, layer - 1))
                data = self._input(shard, layer - 1, parameters)
                if self.stream:
                    rows = RowFile.new(self._spill_directory(), f"shard-{shard.index:05d}-layer-{layer}-",
                                       self.layers[layer - 1], np.float32)
                    for block in below.hidden_probs_chunks(data):
                        rows.append(block)
                    self._inputs[key] = rows
                else:
                    self._inputs[key] = below.hidden_probs(data)
            for old in [k for k in self._inputs if k[0] == shard.index and 0 < k[1] < layer]:
                dropped = self._inputs.pop(old)  # no longer needed: a later layer is training
                if isinstance(dropped, RowFile):
                    dropped.close()
        return self._inputs[key]

    def _stats(self, shard) -> Update:
        """This shard's part of the table's per-feature statistics (raw rows, a block at a time)."""
        if shard.index in self._scaled_shards:  # scaled in place since: this step runs again
            features = self.load_shard(shard.uri, shard.index).features
        else:
            features = shard.features
        stats = FeatureStats.empty(features.shape[1])
        blocks = features.chunks(CHUNK_ROWS) if isinstance(features, RowFile) else (
            features[start:start + CHUNK_ROWS] for start in range(0, features.shape[0], CHUNK_ROWS))
        for block in blocks:
            stats.update(block)
        return Update(shard.index, shard.rows, stats_arrays(stats), {})

    def _scale(self, shard, parameters) -> None:
        """Scale the shard's rows in place by the table's statistics (gathered in the first step)
        when the job scales a table's raw rows: the raw rows are not kept (a later statistics
        step reads them again)."""
        kind = self.config.get("scale")
        if not kind or shard.index in self._scaled_shards:
            return
        scaler = gathered_scaler(parameters, kind)
        raw = shard.features
        if isinstance(raw, RowFile):
            rows = RowFile.new(self._spill_directory(), f"shard-{shard.index:05d}-scaled-", raw.shape[1], np.float32)
            for block in raw.chunks(CHUNK_ROWS):
                rows.append(scaler.transform(block))
            raw.close()
            shard.features = rows
        else:
            for start in range(0, raw.shape[0], CHUNK_ROWS):  # a block at a time: no second copy
                raw[start:start + CHUNK_ROWS] = scaler.transform(raw[start:start + CHUNK_ROWS])
        self._scaled_shards.add(shard.index)

    def _checked_data(self, shard, parameters):
        """The shard's features on the device (in memory) or as its row file (streamed),
        scaled (a table's raw rows) and checked for the visible units: Bernoulli units need [0, 1]."""
        self._scale(shard, parameters)
        unit = self.model.visible == "bernoulli"
        if not isinstance(shard.features, RowFile):
            check_features(shard.features, name=shard.uri, unit_interval=unit)
            return self.model.backend.asarray(shard.features)
        if unit and shard.features.stored != np.uint8:  # uint8 intensities are in [0, 1] by construction
            for start, block in chunks(shard.features, self.model.backend):
                check_features(block, name=f"{shard.uri} (the block from row {start})", unit_interval=True)
        return shard.features

    def _rbm(self, shard, layer: int) -> RBM:
        key = (shard.index, layer)
        if key not in self._rbms:
            # The shuffle of each epoch depends on (job seed, layer, shard) only, so the
            # parts of an epoch synced every k minibatches walk one consistent order.
            seed = int(np.random.SeedSequence([self.model.seed, layer, shard.index]).generate_state(1)[0])
            self._rbms[key] = self.model.make_rbm(layer, seed=seed)
        return self._rbms[key]

    def run(self, step: Step, parameters, shard, seed) -> Update:
        if step.phase == "stats":
            return self._stats(shard)
        if step.phase == "transform":
            data = self._input(shard, step.info["layer"], parameters)
            return Update(shard.index, int(data.shape[0]), {step.arrays[0]: column_mean(data, self.model.backend)}, {})
        if step.phase == "pretrain":
            return self._on_host(self._pretrain(step, parameters, shard, seed))
        if step.phase == "finetune":
            return self._on_host(self._finetune(step, parameters, shard, seed))
        raise ValueError(f"unknown phase {step.phase!r}")

    def run_shards(self, step, parameters, shards, seeds):
        """Several shards' pre-training or fine-tuning steps as one computation where they can step
        together (:class:`~dbn.model.rbm_group.RBMGroup`, :class:`~dbn.model.network_group.NetworkGroup`:
        in-memory data, minibatches of one size and number), each shard's update the bits its own
        :meth:`run` gives; else, and for the other phases, one by one."""
        if step.phase not in TRAINING_PHASES:
            return super().run_shards(step, parameters, shards, seeds)
        return [self._on_host(update) for update in self._trained(step, parameters, shards, seeds)]

    def run_combined(self, step, parameters, shards, seeds):
        """The shards' pre-training or fine-tuning updates combined where they were trained: their
        sample-weighted mean made from the models' own arrays, on a GPU on the device
        (:meth:`_device_mean`), then one copy to the host instead of one a shard. On NumPy the bits of
        the runtime's :func:`~iterreduce.program.combine_updates` of :meth:`run_shards`."""
        if step.phase not in TRAINING_PHASES:
            return super().run_combined(step, parameters, shards, seeds)
        # On the host, the runtime's average a block at a time: the same bits, twice as fast (cache).
        average = weighted_average if self.model.backend.device == "cpu" else self._device_mean
        return combine_updates(self._trained(step, parameters, shards, seeds), step.arrays, average=average)

    def _trained(self, step, parameters, shards, seeds) -> list[Update]:
        """The shards' pre-training or fine-tuning updates holding the models' own device arrays
        (read them before the models train again): as one group where they can step together."""
        together = self._pretrain_group if step.phase == "pretrain" else self._finetune_group
        grouped = together(step, parameters, shards, seeds) if len(shards) > 1 and not self.stream else None
        if grouped is not None:
            return grouped
        train = self._pretrain if step.phase == "pretrain" else self._finetune
        return [train(step, parameters, shard, seed) for shard, seed in zip(shards, seeds)]

    def _on_host(self, update: Update) -> Update:
        """``update`` with its device arrays copied to the host."""
        to_numpy = self.model.backend.to_numpy
        return Update(update.shard, update.samples, {k: to_numpy(v) for k, v in update.arrays.items()}, update.metrics)

    def _device_mean(self, updates: list[Update], names) -> dict:
        """The sample-weighted mean of ``updates``' device arrays ``names``, on the device, copied to
        the host: :func:`~iterreduce.program.weighted_average`'s float64 sum in shard order, whole
        arrays at a time (a kernel each; on NumPy the same bits)."""
        be = self.model.backend
        counted = [u for u in sorted(updates, key=lambda u: u.shard) if u.samples > 0]
        total = float(sum(u.samples for u in counted))
        mean = {}
        for name in names:
            like = counted[0].arrays[name]
            acc = be.xp.zeros(like.shape, dtype=np.float64)
            for update in counted:
                acc += (update.samples / total) * update.arrays[name]
            mean[name] = be.to_numpy(acc.astype(like.dtype))
        return mean

    def _pretrain_group(self, step, parameters, shards, seeds) -> list[Update] | None:
        layer = step.info["layer"]
        data = [self._input(shard, layer, parameters) for shard in shards]
        rbms = [self._rbm(shard, layer) for shard in shards]
        for rbm, seed in zip(rbms, seeds):
            rbm.set_state(state.rbm_state(parameters, layer))
            rbm.backend.reseed(seed)
        try:
            group = self._group if self._group is not None and self._group.holds(rbms) else RBMGroup(rbms)
            found = group.train_epoch(data, step.info["epoch"], self._batches(step, data[0].shape[0], rbms[0].batch_size))
        except GroupError:  # persistent CD, or shards whose minibatches differ: one by one
            return None
        self._group = group
        return [Update(shard.index, stats.n_samples, state.named_rbm_state(layer, rbm.get_state(on_device=True)),
                       {"reconstruction_error": stats.reconstruction_error})
                for shard, rbm, stats in zip(shards, rbms, found)]

    def _batches(self, step, rows: int, batch_size: int) -> range:
        n_batches = rows // min(batch_size, rows)
        if step.info.get("batches") is None:
            return range(n_batches)
        start, stop = step.info["batches"]
        return range(min(start, n_batches), min(stop, n_batches))

    def _pretrain(self, step, parameters, shard, seed) -> Update:
        layer = step.info["layer"]
        data = self._input(shard, layer, parameters)
        rbm = self._rbm(shard, layer)
        rbm.set_state(state.rbm_state(parameters, layer))
        rbm.backend.reseed(seed)
        stats = rbm.train_epoch(data, step.info["epoch"], self._batches(step, data.shape[0], rbm.batch_size), checked=True)
        arrays = state.named_rbm_state(layer, rbm.get_state(on_device=True))  # the RBM's own: see _trained
        return Update(shard.index, stats.n_samples, arrays, {"reconstruction_error": stats.reconstruction_error})

    def _finetune(self, step, parameters, shard, seed) -> Update:
        m, be = self.model, self.model.backend
        data, labels = self._labelled(shard, parameters)
        net = self._net(shard, parameters)
        be.reseed(seed)
        stats = net.train_epoch(data, labels, step.info["epoch"], seed=self._order_seed(shard),
                                batches=self._batches(step, data.shape[0], m.finetune_batch_size),
                                **self._finetune_settings(step))
        return self._finetune_update(step, shard, net, stats)

    def _finetune_update(self, step, shard, net, stats) -> Update:
        arrays = {k: v for k, v in net.get_state(on_device=True).items() if k in step.arrays}  # see _trained
        return Update(shard.index, stats.n_samples, arrays, {"loss": stats.loss, "train_error": stats.train_error})

    def _labelled(self, shard, parameters):
        """The shard's rows (layer 0's input) and its labels: on the device with in-memory data,
        streamed with the rows."""
        if shard.labels is None:
            raise DataError(f"{shard.uri}: fine-tuning needs a 'label' column")
        data = self._input(shard, 0, parameters)
        if shard.index not in self._labels:
            self._labels[shard.index] = (shard.labels if isinstance(data, RowFile)
                                         else self.model.backend.asarray(shard.labels, dtype=np.int64))
        return data, self._labels[shard.index]

    def _net(self, shard, parameters) -> Network:
        """The shard's network with ``parameters`` loaded (kept: set_state reuses its arrays, buffers and CUDA graphs)."""
        net = self._nets.get(shard.index)
        if net is None:
            net = self._nets[shard.index] = Network.from_state(parameters, len(self.layers) + 1, self.model.backend)
        else:
            net.set_state(parameters)
        return net

    def _order_seed(self, shard) -> int:
        """The seed of the shard's fine-tuning order: (job seed, shard) alone, whichever worker holds it."""
        return int(np.random.SeedSequence([self.model.seed, 10_000, shard.index]).generate_state(1)[0])

    def _finetune_settings(self, step) -> dict:
        m = self.model
        return dict(learning_rate=step.info["learning_rate"], momentum=step.info["momentum"], max_norm=m.max_norm,
                    weight_cost=m.finetune_weight_cost, batch_size=m.finetune_batch_size,
                    dropout=[m.input_dropout] + [m.dropout] * len(self.layers),
                    train_layers=slice(-1, None) if step.info["top_only"] else slice(None))

    def _finetune_group(self, step, parameters, shards, seeds) -> list[Update] | None:
        """The shards' fine-tuning step as one computation (:class:`~dbn.model.network_group.NetworkGroup`),
        each member's dropout drawn from a stream seeded as its own run reseeds the worker's; None
        where they cannot step together."""
        if any(shard.labels is None for shard in shards):
            return None  # run() names the shard
        labelled = [self._labelled(shard, parameters) for shard in shards]
        nets = [self._net(shard, parameters) for shard in shards]
        be = self.model.backend
        while len(self._streams) < len(shards):
            self._streams.append(get_backend(be.device, be.dtype.name))
        streams = self._streams[:len(shards)]
        for stream, seed in zip(streams, seeds):
            stream.reseed(seed)
        data = [rows for rows, _ in labelled]
        try:
            group = self._net_group if self._net_group is not None and self._net_group.holds(nets) else NetworkGroup(nets)
            found = group.train_epoch(data, [labels for _, labels in labelled], step.info["epoch"],
                                      seeds=[self._order_seed(shard) for shard in shards], streams=streams,
                                      batches=self._batches(step, data[0].shape[0], self.model.finetune_batch_size),
                                      **self._finetune_settings(step))
        except GroupError:
            return None
        self._net_group = group
        return [self._finetune_update(step, shard, net, stats) for shard, net, stats in zip(shards, nets, found)]
