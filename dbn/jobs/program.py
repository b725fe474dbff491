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

import math

import numpy as np

from iterreduce.program import Program, Step, Update, WorkerProgram, block_momentum_average, weighted_average
from iterreduce.shards import read_shard

from ..model.estimator import DBN
from ..model.network import Network
from ..model.rbm import RBM
from ..data.sharding import count_classes
from ..data.validation import check_features

RBM_KEYS = ("weights", "hidden_bias", "visible_bias", "weights_inc", "hidden_bias_inc", "visible_bias_inc")


def dbn_params(config) -> dict:
    """The :class:`DBN` hyperparameters in a program config (without device and runtime keys)."""
    return {k: v for k, v in config.items()
            if k not in ("n_classes", "sync_every", "block_momentum", "pretrain_block_momentum", "validation",
                         "device", "callback")}


def rbm_arrays(layer: int) -> tuple[str, ...]:
    return tuple(f"rbm.{layer}.{k}" for k in RBM_KEYS)


def net_arrays(n_layers: int, only: range | None = None) -> tuple[str, ...]:
    layers = range(n_layers) if only is None else only
    return tuple(f"net.{k}.{i}" for i in layers for k in ("weights", "biases", "weights_inc", "biases_inc"))


class DBNProgram(Program):
    """Master side. ``config``: DBN hyperparameters (see :class:`dbn.DBN`) plus
    ``n_classes`` (None: counted from the labels), ``seed``, ``sync_every`` (minibatches per synchronisation;
    0 or absent = once per epoch, the paper's setting) and ``block_momentum``
    for fine-tuning (0 = plain averaging; see :func:`iterreduce.program.block_momentum_average`),
    and ``validation``: URI of a labelled shard for a validation error per fine-tuning epoch."""

    worker_class = "dbn.jobs.program:DBNWorker"

    def __init__(self, config):
        super().__init__(config)
        self.model = DBN(**dbn_params(config), device="cpu")
        self.layers = self.model.hidden_layers
        self.n_classes = config.get("n_classes")  # None: counted from the shards' labels at the start
        self._validation = None
        self._finetune_parts = 1

    def _parts(self, shards, batch_size) -> int:
        sync = int(self.config.get("sync_every") or 0)
        most = max(s["rows"] // min(batch_size, s["rows"]) for s in shards)
        return 1 if not sync else math.ceil(most / sync)

    def _ranges(self, part: int, parts: int) -> list | None:
        sync = int(self.config.get("sync_every") or 0)
        return None if parts == 1 else [part * sync, (part + 1) * sync]

    def schedule(self, shards):
        m = self.model
        parts = self._parts(shards, m.pretrain_batch_size)
        for layer in range(len(self.layers)):
            yield Step("transform", {"layer": layer}, (f"rbm.{layer}.visible_bias",))
            for epoch in range(m.pretrain_epochs):
                for part in range(parts):
                    yield Step("pretrain", {"layer": layer, "epoch": epoch, "part": part,
                                            "batches": self._ranges(part, parts)}, rbm_arrays(layer))
        parts = self._finetune_parts = self._parts(shards, m.finetune_batch_size)
        n = len(self.layers) + 1
        for epoch in range(m.finetune_epochs):
            top_only = epoch < m.top_layer_epochs
            for part in range(parts):
                yield Step("finetune", {
                    "epoch": epoch, "part": part, "batches": self._ranges(part, parts),
                    "learning_rate": m.finetune_learning_rate * m.finetune_lr_decay ** epoch,
                    "top_only": top_only,
                }, net_arrays(n, range(n - 1, n) if top_only else None))

    def initial_parameters(self, seed, shards):
        unlabelled = [s["uri"] for s in shards if not s["labels"]]
        if self.model.finetune_epochs > 0 and unlabelled:
            raise ValueError(f"fine-tuning needs labels, but these shards have no 'label' column: {unlabelled[:3]}")
        widths = {s["features"] for s in shards}
        if len(widths) != 1 or None in widths:
            raise ValueError(f"shards disagree on the feature count or do not fix it: {sorted(map(str, widths))}")
        sizes = [widths.pop(), *self.layers]
        n_classes = self.n_classes
        if n_classes is None:  # unlabelled shards (pre-training only) get a placeholder output layer
            n_classes = count_classes([s["uri"] for s in shards]) if not unlabelled else 1
        params = {}
        for layer in range(len(self.layers)):
            rbm = self.model._make_rbm(layer)
            rbm.seed = seed + 1000 * (layer + 1)
            rbm.backend.reseed(rbm.seed)
            rbm.initialize(n_visible=sizes[layer])
            params.update({f"rbm.{layer}.{k}": v for k, v in rbm.get_state().items()})
        rng = np.random.default_rng([seed, 99])
        params["net.weights.out"] = (0.01 * rng.standard_normal((self.layers[-1], int(n_classes)))).astype(np.float32)
        return params

    def before_step(self, step, parameters):
        if step.phase == "finetune" and "net.weights.0" not in parameters:
            # Fine-tuning starts from the pre-trained stack plus a fresh softmax layer.
            params = dict(parameters)
            n = len(self.layers)
            for i in range(n):
                params[f"net.weights.{i}"] = parameters[f"rbm.{i}.weights"].copy()
                params[f"net.biases.{i}"] = parameters[f"rbm.{i}.hidden_bias"].copy()
            params[f"net.weights.{n}"] = parameters["net.weights.out"]
            params[f"net.biases.{n}"] = np.zeros(params[f"net.weights.{n}"].shape[1], np.float32)
            for i in range(n + 1):
                params[f"net.weights_inc.{i}"] = np.zeros_like(params[f"net.weights.{i}"])
                params[f"net.biases_inc.{i}"] = np.zeros_like(params[f"net.biases.{i}"])
            return params
        return parameters

    def reduce(self, step, parameters, updates):
        if step.phase == "transform":
            # Workers report their input's mean; Bernoulli visible biases start at its logit.
            name = step.arrays[0]
            mean = weighted_average(updates, [name])[name]
            if step.info["layer"] == 0 and self.model.visible == "gaussian":
                return {name: np.zeros_like(mean)}
            p = np.clip(mean, 1e-3, 1 - 1e-3)
            return {name: np.log(p / (1 - p)).astype(np.float32)}
        # Block momentum speeds up fine-tuning only: in CD pre-training it compounded with the
        # RBMs' own momentum of 0.9 and slowed convergence (MNIST, 10 workers, measured).
        key = "block_momentum" if step.phase == "finetune" else "pretrain_block_momentum"
        momentum = float(self.config.get(key) or 0.0)
        increments = [name for name in step.arrays if "_inc" in name]
        return block_momentum_average(parameters, updates, step.arrays, momentum, plain=increments)

    def evaluate(self, step, parameters):
        """Validation error after each fine-tuning epoch, when ``config["validation"]`` names
        a labelled shard (the master reads it once; it is never trained on)."""
        uri = self.config.get("validation")
        if not uri or step.phase != "finetune" or step.info.get("part", 0) != self._finetune_parts - 1:
            return {}
        if self._validation is None:
            self._validation = read_shard(uri, need_labels=True)
        n = len(self.layers) + 1
        net = Network([parameters[f"net.weights.{i}"] for i in range(n)],
                      [parameters[f"net.biases.{i}"] for i in range(n)], self.model.backend)
        proba = net.predict_proba_device(self.model.backend.asarray(self._validation.features))
        predicted = self.model.backend.to_numpy(proba).argmax(axis=1)
        return {"valid_error": float(np.mean(predicted != self._validation.labels))}

    def finalize(self, parameters, output_dir):
        self.to_model(parameters).save(f"{output_dir}/model.npz")

    def to_model(self, parameters) -> DBN:
        """The trained :class:`DBN` from the final parameters."""
        model = DBN(**dbn_params(self.config), device="cpu")
        model.n_features_in_ = int(parameters["rbm.0.weights"].shape[0])
        for layer in range(len(self.layers)):
            rbm = model._make_rbm(layer)
            rbm.set_state({k: parameters[f"rbm.{layer}.{k}"] for k in RBM_KEYS})
            model.rbms_.append(rbm)
        n = len(self.layers) + 1
        if "net.weights.0" in parameters:
            model.network_ = Network([parameters[f"net.weights.{i}"] for i in range(n)],
                                     [parameters[f"net.biases.{i}"] for i in range(n)], model.backend)
            model.n_classes_ = int(parameters[f"net.biases.{n - 1}"].shape[0])
        return model


class DBNWorker(WorkerProgram):
    """Worker side: trains RBM layers and the network on its shards."""

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self.model = DBN(**dbn_params(config), device=device)
        self.layers = self.model.hidden_layers
        self._inputs: dict[tuple[int, int], object] = {}  # (shard, layer) -> that layer's input, on the device
        self._rbms: dict[tuple[int, int], RBM] = {}
        self._labels: dict[int, object] = {}

    def _input(self, shard, layer: int, parameters):
        """Layer ``layer``'s input for ``shard``, computed locally from the layers below."""
        key = (shard.index, layer)
        if key not in self._inputs:
            if layer == 0:
                check_features(shard.features, name=shard.uri, unit_interval=self.model.visible == "bernoulli")
                self._inputs[key] = self.model.backend.asarray(shard.features)
            else:
                below = self._rbm(shard, layer - 1)
                below.set_state({k: parameters[f"rbm.{layer - 1}.{k}"] for k in RBM_KEYS})
                self._inputs[key] = below._hidden_probs(self._input(shard, layer - 1, parameters))
        return self._inputs[key]

    def _rbm(self, shard, layer: int) -> RBM:
        key = (shard.index, layer)
        if key not in self._rbms:
            rbm = self.model._make_rbm(layer)
            # The shuffle of each epoch depends on (job seed, layer, shard) only, so the
            # parts of an epoch synced every k minibatches walk one consistent order.
            rbm.seed = int(np.random.SeedSequence([self.model.seed, layer, shard.index]).generate_state(1)[0])
            self._rbms[key] = rbm
        return self._rbms[key]

    def run(self, step: Step, parameters, shard, seed) -> Update:
        if step.phase == "transform":
            data = self._input(shard, step.info["layer"], parameters)
            mean = self.model.backend.to_numpy(data.mean(axis=0)).astype(np.float32)
            return Update(shard.index, int(data.shape[0]), {step.arrays[0]: mean}, {})
        if step.phase == "pretrain":
            return self._pretrain(step, parameters, shard, seed)
        if step.phase == "finetune":
            return self._finetune(step, parameters, shard, seed)
        raise ValueError(f"unknown phase {step.phase!r}")

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
        rbm.set_state({k: parameters[f"rbm.{layer}.{k}"] for k in RBM_KEYS})
        rbm.backend.reseed(seed)
        stats = rbm.train_epoch(data, step.info["epoch"], self._batches(step, data.shape[0], rbm.batch_size), checked=True)
        arrays = {f"rbm.{layer}.{k}": v for k, v in rbm.get_state().items()}
        return Update(shard.index, stats.n_samples, arrays, {"reconstruction_error": stats.reconstruction_error})

    def _finetune(self, step, parameters, shard, seed) -> Update:
        m, be = self.model, self.model.backend
        if shard.labels is None:
            raise ValueError(f"{shard.uri}: fine-tuning needs a 'label' column")
        n = len(self.layers) + 1
        data = self._input(shard, 0, parameters)
        if shard.index not in self._labels:
            self._labels[shard.index] = be.asarray(shard.labels, dtype=np.int64)
        state = {k.removeprefix("net."): v for k, v in parameters.items() if k.startswith("net.") and k[-1].isdigit()}
        net = Network([state[f"weights.{i}"] for i in range(n)], [state[f"biases.{i}"] for i in range(n)], be)
        net.set_state(state)
        be.reseed(seed)
        order_seed = int(np.random.SeedSequence([m.seed, 10_000, shard.index]).generate_state(1)[0])
        stats = net.train_epoch(
            data, self._labels[shard.index], step.info["epoch"],
            learning_rate=step.info["learning_rate"], momentum=m.finetune_momentum,
            weight_cost=m.finetune_weight_cost, batch_size=m.finetune_batch_size,
            dropout=[m.input_dropout] + [m.dropout] * len(self.layers),
            train_layers=slice(-1, None) if step.info["top_only"] else slice(None),
            seed=order_seed, batches=self._batches(step, data.shape[0], m.finetune_batch_size),
        )
        arrays = {f"net.{k}": v for k, v in net.get_state().items() if f"net.{k}" in step.arrays}
        return Update(shard.index, stats.n_samples, arrays, {"loss": stats.loss, "train_error": stats.train_error})
