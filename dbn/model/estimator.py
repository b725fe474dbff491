"""Deep Belief Network: greedy layer-wise RBM pre-training, then backprop fine-tuning."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from . import persist
from .backend import Backend
from .network import Network
from .rbm import RBM
from ..data.validation import DataError, check_features, check_labels


class DBN:
    """A stack of RBMs, fine-tuned as a classifier with a softmax output layer.

    Scikit-learn style: hyperparameters here, learned state in attributes with a
    trailing underscore, ``fit`` / ``transform`` / ``predict`` / ``score``.

    Parameters
    ----------
    hidden_layers : sequence of int
        Hidden layer sizes, e.g. ``[500, 500, 2000]`` (Hinton & Salakhutdinov).
    visible : "bernoulli" or "gaussian"
        Units of the first RBM's visible layer (data in [0, 1], or real-valued).
    cd_k, persistent, pretrain_epochs, pretrain_learning_rate, momentum,
    final_momentum, momentum_epoch, weight_cost, pretrain_batch_size :
        RBM pre-training, see :class:`dbn.model.rbm.RBM`. ``pretrain_learning_rate``
        may be a list with one rate per layer.
    finetune_epochs, finetune_learning_rate, finetune_lr_decay, finetune_momentum,
    finetune_weight_cost, finetune_batch_size :
        SGD with momentum on the cross-entropy; the learning rate is multiplied by
        ``finetune_lr_decay`` after every epoch.
    top_layer_epochs : int
        Fine-tuning epochs that train only the softmax layer first (Hinton's backprop.m: 5).
    dropout, input_dropout : float
        Drop probabilities of hidden units and input units during fine-tuning.
    validation_fraction : float
        Fraction of the training data held out to report validation error each
        fine-tuning epoch; with ``early_stopping_patience`` the best epoch's
        weights are kept and training stops after that many epochs without gain.
    device : "cpu", "gpu" or "auto"
    seed : int
    callback : callable(dict) or None
        Called with a progress record after every epoch of every phase.

    Learned attributes
    ------------------
    rbms_ : list of RBM            the pre-trained layers (as pre-trained)
    network_ : Network or None     the fine-tuned network (hidden layers + softmax)
    n_features_in_, n_classes_ : int
    history_ : list of dict        every progress record
    """

    def __init__(
        self,
        hidden_layers=(500, 500, 2000),
        *,
        visible: str = "bernoulli",
        cd_k: int = 1,
        persistent: bool = False,
        pretrain_epochs: int = 50,
        pretrain_learning_rate: float | list = 0.1,
        momentum: float = 0.5,
        final_momentum: float = 0.9,
        momentum_epoch: int = 5,
        weight_cost: float = 2e-4,
        pretrain_batch_size: int = 100,
        finetune_epochs: int = 50,
        finetune_learning_rate: float = 0.1,
        finetune_lr_decay: float = 1.0,
        finetune_momentum: float = 0.9,
        finetune_weight_cost: float = 0.0,
        finetune_batch_size: int = 100,
        top_layer_epochs: int = 5,
        dropout: float = 0.0,
        input_dropout: float = 0.0,
        validation_fraction: float = 0.0,
        early_stopping_patience: int | None = None,
        device: str = "auto",
        seed: int = 0,
        callback: Callable[[dict], None] | None = None,
    ):
        self.hidden_layers = [int(n) for n in hidden_layers]
        if not self.hidden_layers or min(self.hidden_layers) < 1:
            raise ValueError(f"hidden_layers must be a non-empty list of positive sizes, got {hidden_layers!r}")
        rates = pretrain_learning_rate if isinstance(pretrain_learning_rate, (list, tuple)) else [pretrain_learning_rate] * len(self.hidden_layers)
        if len(rates) != len(self.hidden_layers):
            raise ValueError(
                f"pretrain_learning_rate has {len(rates)} values for {len(self.hidden_layers)} hidden layers"
            )
        for name, p in (("dropout", dropout), ("input_dropout", input_dropout), ("validation_fraction", validation_fraction)):
            if not 0 <= p < 1:
                raise ValueError(f"{name} must be in [0, 1), got {p!r}")
        self.visible = visible
        self.cd_k = cd_k
        self.persistent = persistent
        self.pretrain_epochs = pretrain_epochs
        self.pretrain_learning_rate = [float(r) for r in rates]
        self.momentum = momentum
        self.final_momentum = final_momentum
        self.momentum_epoch = momentum_epoch
        self.weight_cost = weight_cost
        self.pretrain_batch_size = pretrain_batch_size
        self.finetune_epochs = finetune_epochs
        self.finetune_learning_rate = finetune_learning_rate
        self.finetune_lr_decay = finetune_lr_decay
        self.finetune_momentum = finetune_momentum
        self.finetune_weight_cost = finetune_weight_cost
        self.finetune_batch_size = finetune_batch_size
        self.top_layer_epochs = top_layer_epochs
        self.dropout = dropout
        self.input_dropout = input_dropout
        self.validation_fraction = validation_fraction
        self.early_stopping_patience = early_stopping_patience
        self.device = device
        self.seed = seed
        self.callback = callback
        self.backend = Backend(device, "float32", seed)
        self.rbms_: list[RBM] = []
        self.network_: Network | None = None
        self.history_: list[dict] = []

    # ---------------------------------------------------------- parameters

    def get_params(self) -> dict:
        """Hyperparameters as a JSON-friendly dict (the model file's config)."""
        names = (
            "hidden_layers visible cd_k persistent pretrain_epochs pretrain_learning_rate momentum "
            "final_momentum momentum_epoch weight_cost pretrain_batch_size finetune_epochs "
            "finetune_learning_rate finetune_lr_decay finetune_momentum finetune_weight_cost "
            "finetune_batch_size top_layer_epochs dropout input_dropout validation_fraction "
            "early_stopping_patience device seed"
        ).split()
        return {name: getattr(self, name) for name in names}

    def _make_rbm(self, layer: int) -> RBM:
        return RBM(
            self.hidden_layers[layer],
            visible=self.visible if layer == 0 else "bernoulli",
            cd_k=self.cd_k,
            persistent=self.persistent,
            learning_rate=self.pretrain_learning_rate[layer],
            momentum=self.momentum,
            final_momentum=self.final_momentum,
            momentum_epoch=self.momentum_epoch,
            weight_cost=self.weight_cost,
            batch_size=self.pretrain_batch_size,
            epochs=self.pretrain_epochs,
            device=self.backend.device,
            seed=self.seed + 1000 * (layer + 1),
        )

    def _report(self, record: dict) -> None:
        self.history_.append(record)
        if self.callback is not None:
            self.callback(record)

    # ------------------------------------------------------------ training

    def fit(self, X, y) -> "DBN":
        """Pre-train on ``X``, then fine-tune on ``(X, y)``."""
        X = self._check_X(X, fitted=False)
        y = check_labels(y, n_samples=X.shape[0])
        self.pretrain(X)
        return self.finetune(X, y)

    def pretrain(self, X) -> "DBN":
        """Greedy layer-wise CD training; each layer learns on the one below's mean-field output."""
        data = self._check_X(X, fitted=False)
        self.n_features_in_ = data.shape[1]
        self.rbms_, self.network_ = [], None
        for layer in range(len(self.hidden_layers)):
            rbm = self._make_rbm(layer)
            rbm.initialize(data)
            start = time.perf_counter()
            for epoch in range(self.pretrain_epochs):
                stats = rbm.train_epoch(data, epoch, checked=True)
                self._report({
                    "phase": "pretrain", "layer": layer, "epoch": epoch,
                    "reconstruction_error": stats.reconstruction_error,
                    "samples": stats.n_samples, "seconds": time.perf_counter() - start,
                })
            self.rbms_.append(rbm)
            if layer + 1 < len(self.hidden_layers):
                data = rbm._hidden_probs(data)
        return self

    def finetune(self, X, y) -> "DBN":
        """Backprop fine-tuning of the pre-trained stack with a softmax output layer."""
        if not self.rbms_:
            raise RuntimeError("finetune needs a pre-trained model: call pretrain() or fit() first")
        be, xp = self.backend, self.backend.xp
        X = self._check_X(X)
        y = check_labels(y, n_samples=X.shape[0])
        self.n_classes_ = int(y.max()) + 1 if self.network_ is None else self.network_.n_classes
        y = check_labels(y, n_samples=X.shape[0], n_classes=self.n_classes_)
        X_train, y_train, X_valid, y_valid = self._split_validation(X, y)

        if self.network_ is None:
            weights = [rbm.weights_ for rbm in self.rbms_]
            biases = [rbm.hidden_bias_ for rbm in self.rbms_]
            weights.append(be.normal((self.hidden_layers[-1], self.n_classes_), scale=0.01))
            biases.append(be.zeros(self.n_classes_))
            self.network_ = Network([xp.array(w) for w in weights], [xp.array(b) for b in biases], be)
        net = self.network_
        dropout = [self.input_dropout] + [self.dropout] * len(self.hidden_layers)
        y_train_dev = be.asarray(y_train, dtype=np.int64)
        best_error, best_state, since_best = np.inf, None, 0
        start = time.perf_counter()
        for epoch in range(self.finetune_epochs):
            top_only = epoch < self.top_layer_epochs
            stats = net.train_epoch(
                X_train, y_train_dev, epoch,
                learning_rate=self.finetune_learning_rate * self.finetune_lr_decay ** epoch,
                momentum=self.finetune_momentum,
                weight_cost=self.finetune_weight_cost,
                batch_size=self.finetune_batch_size,
                dropout=dropout,
                train_layers=slice(-1, None) if top_only else slice(None),
                seed=self.seed,
            )
            record = {
                "phase": "finetune", "epoch": epoch, "loss": stats.loss,
                "train_error": stats.train_error, "samples": stats.n_samples,
                "seconds": time.perf_counter() - start,
            }
            if X_valid is not None:
                record["valid_error"] = self._error(X_valid, y_valid)
                if record["valid_error"] < best_error:
                    best_error, best_state, since_best = record["valid_error"], net.get_state(), 0
                else:
                    since_best += 1
            self._report(record)
            if self.early_stopping_patience is not None and since_best >= self.early_stopping_patience and not top_only:
                break
        if best_state is not None and self.early_stopping_patience is not None:
            net.set_state(best_state)
        return self

    def _split_validation(self, X, y):
        if not self.validation_fraction:
            return X, y, None, None
        n_valid = int(round(X.shape[0] * self.validation_fraction))
        if n_valid < 1 or n_valid >= X.shape[0]:
            raise DataError(
                f"validation_fraction={self.validation_fraction} leaves {n_valid} of {X.shape[0]} samples for validation"
            )
        order = np.random.default_rng([self.seed, 7]).permutation(X.shape[0])
        valid, train = order[:n_valid], order[n_valid:]
        xp = self.backend.xp
        return X[xp.asarray(train)], y[train], X[xp.asarray(valid)], y[valid]

    # ----------------------------------------------------------- inference

    def _check_X(self, X, fitted: bool = True):
        n_features = getattr(self, "n_features_in_", None) if fitted else None
        X = check_features(X, n_features=n_features, unit_interval=self.visible == "bernoulli")
        return self.backend.asarray(X)

    def transform(self, X) -> np.ndarray:
        """Top hidden layer's mean-field activations (fine-tuned weights when fine-tuned)."""
        self._require_fitted()
        data = self._check_X(X)
        if self.network_ is None:
            for rbm in self.rbms_:
                data = rbm._hidden_probs(data)
            return self.backend.to_numpy(data)
        net, be = self.network_, self.backend
        for w, b in zip(net.weights[:-1], net.biases[:-1]):
            data = data @ w
            data += b
            be.sigmoid(data, out=data)
        return be.to_numpy(data)

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities, shape (n_samples, n_classes)."""
        self._require_classifier()
        return self.backend.to_numpy(self.network_.predict_proba_device(self._check_X(X)))

    def predict(self, X) -> np.ndarray:
        """Most probable class of each row."""
        return self.predict_proba(X).argmax(axis=1)

    def score(self, X, y) -> float:
        """Accuracy on ``(X, y)`` (1 - error rate)."""
        self._require_classifier()
        X = self._check_X(X)
        y = check_labels(y, n_samples=X.shape[0], n_classes=self.n_classes_)
        return 1.0 - self._error(X, y)

    def _error(self, X, y) -> float:
        probs = self.network_.predict_proba_device(X)
        predicted = self.backend.to_numpy(probs.argmax(axis=1))
        return float(np.mean(predicted != y))

    def _require_fitted(self) -> None:
        if not self.rbms_ and self.network_ is None:
            raise RuntimeError("this DBN is not fitted yet: call fit() or pretrain() first")

    def _require_classifier(self) -> None:
        if self.network_ is None:
            raise RuntimeError("this DBN has no classifier yet: call fit() or finetune() first")

    # --------------------------------------------------------- persistence

    def save(self, path) -> None:
        """Write the model to ``path`` (.npz + JSON header, no pickle), atomically."""
        self._require_fitted()
        to_np = self.backend.to_numpy
        arrays = {}
        for i, rbm in enumerate(self.rbms_):
            for key, value in rbm.get_state().items():
                if not key.endswith("_inc"):
                    arrays[f"rbm.{i}.{key}"] = value
        if self.network_ is not None:
            for i, (w, b) in enumerate(zip(self.network_.weights, self.network_.biases)):
                arrays[f"network.weights.{i}"] = to_np(w)
                arrays[f"network.biases.{i}"] = to_np(b)
        header = {
            "params": self.get_params(),
            "n_features_in": self.n_features_in_,
            "n_classes": getattr(self, "n_classes_", None),
            "n_rbms": len(self.rbms_),
            "has_network": self.network_ is not None,
        }
        persist.save_arrays(path, header, arrays)

    @classmethod
    def load(cls, path, device: str = "auto") -> "DBN":
        """Read a model written by :meth:`save`, onto ``device`` (a GPU-trained model loads on a CPU)."""
        header, arrays = persist.load_arrays(path)
        try:
            params = dict(header["params"])
            params["device"] = device
            model = cls(**params)
            model.n_features_in_ = int(header["n_features_in"])
            for i in range(int(header["n_rbms"])):
                rbm = model._make_rbm(i)
                rbm.set_state({k: arrays[f"rbm.{i}.{k}"] for k in ("weights", "visible_bias", "hidden_bias")})
                model.rbms_.append(rbm)
            if header["has_network"]:
                n = len(model.hidden_layers) + 1
                model.network_ = Network(
                    [arrays[f"network.weights.{i}"] for i in range(n)],
                    [arrays[f"network.biases.{i}"] for i in range(n)],
                    model.backend,
                )
                model.n_classes_ = int(header["n_classes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise persist.ModelFileError(f"{path}: model file is inconsistent: {exc!r}") from exc
        return model

