"""Deep Belief Network: greedy layer-wise RBM pre-training, then backprop fine-tuning."""

from __future__ import annotations

import numbers
import time
import warnings
from typing import Callable

import numpy as np

from ..data.validation import DataError, check_labels, label_indices, minibatch_warnings
from ..errors import ModelFileError
from . import persist, preprocess, state
from .base import Estimator
from .divergence import check_epoch
from .inputs import RawInputs
from .network import Network
from .rbm import RBM


#: The range of each numeric hyperparameter (``validate_params``); None is allowed where the
#: default is None. The RBMs check cd_k and the batch size again, the job file the counts.
_PARAM_RANGES = {
    "cd_k": "count>=1", "pretrain_batch_size": "count>=1", "finetune_batch_size": "count>=1",
    "pretrain_epochs": "count>=0", "finetune_epochs": "count>=0", "top_layer_epochs": "count>=0",
    "momentum_epoch": "count>=0", "finetune_momentum_epochs": "count>=0", "early_stopping_patience": "count>=1",
    "finetune_learning_rate": "positive", "finetune_lr_decay": "positive",
    "weight_cost": ">=0", "finetune_weight_cost": ">=0", "max_norm": ">=0",
    "momentum": "[0, 1)", "final_momentum": "[0, 1)", "finetune_momentum": "[0, 1)",
    "finetune_final_momentum": "[0, 1)", "dropout": "[0, 1)", "input_dropout": "[0, 1)",
    "validation_fraction": "[0, 1)",
}
_NULLABLE = ("finetune_final_momentum", "early_stopping_patience")


def _check_range(name: str, value, rule: str) -> None:
    """Raise ValueError naming ``name`` unless ``value`` satisfies ``rule`` (see :data:`_PARAM_RANGES`)."""
    if value is None and name in _NULLABLE:
        return
    if rule.startswith("count"):
        low = int(rule[-1])
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low
        what = f"an integer >= {low}"
    else:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and bool(np.isfinite(value)) and {
            "positive": lambda v: v > 0, ">=0": lambda v: v >= 0,
            "[0, 1)": lambda v: 0 <= v < 1}[rule](value)
        what = {"positive": "a number > 0", ">=0": "a number >= 0"}.get(rule, f"in {rule}")
    if not ok:
        raise ValueError(f"{name} must be {what}{' (or None)' if name in _NULLABLE else ''}, got {value!r}")


#: The RBMs' learning rate (Hinton's rbm.m) ...
LEARNING_RATE = 0.1
#: ... and a first RBM's with Gaussian visible units: one or two orders of magnitude lower
#: (Hinton's practical guide, 13.2); standardised data of 50 features diverged to NaN at 0.1.
GAUSSIAN_LEARNING_RATE = 0.001


def layer_seed(seed: int, layer: int) -> int:
    """The seed of the RBM of hidden layer ``layer`` in a DBN seeded ``seed``."""
    return seed + 1000 * (layer + 1)


class DBN(RawInputs, Estimator):
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
        may be a list with one rate per layer; None (the default): 0.1 a layer, but
        :data:`GAUSSIAN_LEARNING_RATE` for Gaussian visible units, which diverge at 0.1.
    finetune_epochs, finetune_learning_rate, finetune_lr_decay, finetune_momentum,
    finetune_final_momentum, finetune_momentum_epochs, finetune_weight_cost, finetune_batch_size :
        SGD with momentum on the cross-entropy; the learning rate is multiplied by
        ``finetune_lr_decay`` after every epoch; the momentum rises linearly from
        ``finetune_momentum`` to ``finetune_final_momentum`` (None: it stays) over the
        first ``finetune_momentum_epochs`` epochs (see :meth:`finetune_schedule`).
    max_norm : float
        Fine-tuning keeps every unit's vector of incoming weights at most this long
        (Srivastava et al. 2014, with dropout); 0: no constraint.
    top_layer_epochs : int
        Fine-tuning epochs that train only the softmax layer first (Hinton's backprop.m: 5).
    n_classes : int or None
        Classes of the softmax layer; labels must be 0..n_classes-1 (others are an
        error). None: the largest label + 1.
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
    input_scaler_ : Scaler or None the scaler of raw rows (:meth:`set_inputs`; absent or None: none)
    classes_ : ndarray or None     the label value of each class (:meth:`set_inputs`; absent or None: 0..K-1)
    input_columns_ : tuple or None the columns the features come from (:meth:`set_inputs`; absent or None: none)
    input_widths_ : tuple or None the features each of them gives (None: not known)

    ``fit``, ``pretrain`` and ``finetune`` take the data as the network sees it (features
    scaled, labels as class indices 0..K-1, or as strings: their sorted distinct values, or
    ``classes_`` when set, are the classes); ``transform``, ``predict_proba``, ``predict``
    and ``score`` take raw rows, which ``input_scaler_`` scales first, and ``predict`` and
    ``score`` speak in the label values of ``classes_``. Rows come as an array, or as a pyarrow
    Table or a pandas DataFrame, read by column name: ``fit`` and ``pretrain`` keep the names
    as ``input_columns_`` (unless set before), and every later call reads those columns.

    The arguments of ``__init__`` are the hyperparameters, kept as given:
    :meth:`get_params` / :meth:`set_params` read and write them, :meth:`validate_params`
    checks them (``fit``, ``pretrain`` and ``finetune`` call it). The learned arrays
    map to flat names and back with :mod:`dbn.model.state`.
    """

    dtype = "float32"  # not a hyperparameter: training runs in float32

    def __init__(
        self,
        hidden_layers=(500, 500, 2000),
        *,
        visible: str = "bernoulli",
        cd_k: int = 1,
        persistent: bool = False,
        pretrain_epochs: int = 50,
        pretrain_learning_rate: float | list | None = None,
        # One schedule: momentum until epoch momentum_epoch, final_momentum from then on.
        momentum: float = 0.5, final_momentum: float = 0.9, momentum_epoch: int = 5,
        weight_cost: float = 2e-4,
        pretrain_batch_size: int = 100,
        finetune_epochs: int = 50,
        finetune_learning_rate: float = 0.1,
        finetune_lr_decay: float = 1.0,
        finetune_momentum: float = 0.9,
        finetune_final_momentum: float | None = None,
        finetune_momentum_epochs: int = 0,
        finetune_weight_cost: float = 0.0,
        max_norm: float = 0.0,
        finetune_batch_size: int = 100,
        top_layer_epochs: int = 5,
        n_classes: int | None = None,
        dropout: float = 0.0,
        input_dropout: float = 0.0,
        validation_fraction: float = 0.0,
        early_stopping_patience: int | None = None,
        device: str = "auto",
        seed: int = 0,
        callback: Callable[[dict], None] | None = None,
    ):
        self._store_params(locals())
        self.rbms_: list[RBM] = []
        self.network_: Network | None = None
        self.history_: list[dict] = []

    # ---------------------------------------------------------- parameters

    def validate_params(self) -> "DBN":
        """Check the hyperparameters (``fit``, ``pretrain`` and ``finetune`` call it); returns self.

        The RBMs check their own settings (``cd_k``, ``pretrain_batch_size``, ...) when pre-training starts.
        """
        try:
            sizes_ok = len(self.hidden_layers) > 0 and all(
                isinstance(n, numbers.Integral) and n >= 1 for n in self.hidden_layers)
        except TypeError:  # not a sequence
            sizes_ok = False
        if not sizes_ok:
            raise ValueError(f"hidden_layers must be a non-empty list of positive sizes, got {self.hidden_layers!r}")
        for rate in self.pretrain_rates():
            _check_range("pretrain_learning_rate", rate, "positive")
        for name, rule in _PARAM_RANGES.items():
            _check_range(name, getattr(self, name), rule)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if self.n_classes is not None and not (isinstance(self.n_classes, numbers.Integral) and self.n_classes >= 2):
            raise ValueError(f"n_classes must be an integer of at least 2 (or None: from the labels), "
                             f"got {self.n_classes!r}")
        return self

    def finetune_schedule(self, epoch: int) -> tuple[float, float]:
        """(learning rate, momentum) of fine-tuning epoch ``epoch`` (from 0): the rate decays
        by ``finetune_lr_decay`` an epoch; the momentum rises linearly from ``finetune_momentum``
        to ``finetune_final_momentum`` over ``finetune_momentum_epochs`` epochs, then stays."""
        rate = self.finetune_learning_rate * self.finetune_lr_decay ** epoch
        start, final, ramp = self.finetune_momentum, self.finetune_final_momentum, self.finetune_momentum_epochs
        if final is None:
            return rate, start
        return rate, final if epoch >= ramp else start + (final - start) * epoch / ramp

    def pretrain_rates(self) -> list:
        """One pre-training learning rate per hidden layer (``pretrain_learning_rate`` or the defaults)."""
        rate, n = self.pretrain_learning_rate, len(self.hidden_layers)
        if rate is None:
            first = GAUSSIAN_LEARNING_RATE if self.visible == "gaussian" else LEARNING_RATE
            return [first] + [LEARNING_RATE] * (n - 1)
        rates = list(rate) if isinstance(rate, (list, tuple)) else [rate] * n
        if len(rates) != n:
            raise ValueError(f"pretrain_learning_rate has {len(rates)} values for {n} hidden layers")
        return rates

    def make_rbm(self, layer: int, seed: int | None = None) -> RBM:
        """The untrained RBM of hidden layer ``layer`` with this DBN's settings, seeded ``seed``
        (default: :func:`layer_seed` of this DBN's seed)."""
        return RBM(
            self.hidden_layers[layer],
            visible=self.visible if layer == 0 else "bernoulli",
            cd_k=self.cd_k,
            persistent=self.persistent,
            learning_rate=self.pretrain_rates()[layer],
            momentum=self.momentum,
            final_momentum=self.final_momentum,
            momentum_epoch=self.momentum_epoch,
            weight_cost=self.weight_cost,
            batch_size=self.pretrain_batch_size,
            epochs=self.pretrain_epochs,
            device=self.device,
            seed=layer_seed(self.seed, layer) if seed is None else seed,
        )

    def _report(self, record: dict) -> None:
        self.history_.append(record)
        if self.callback is not None:
            self.callback(record)

    # ------------------------------------------------------------ training

    @property
    def fine_tunes(self) -> bool:
        """Whether :meth:`fit` fine-tunes a classifier (and so needs labels): ``finetune_epochs > 0``.
        With 0 it pre-trains only: an unsupervised feature extractor (:meth:`transform`)."""
        return self.finetune_epochs > 0

    def fit(self, X, y=None, *, validation_data=None) -> "DBN":
        """Pre-train on ``X``, then fine-tune on ``(X, y)`` (``validation_data``: see :meth:`finetune`);
        with ``finetune_epochs=0`` pre-train only, without labels (``y`` is not used)."""
        self.validate_params()
        X = self._check_X(self._rows(X, record=True), fitted=False)
        for message in minibatch_warnings(X.shape[0], self, name="X", fine_tunes=self.fine_tunes, python=True):
            warnings.warn(message, UserWarning, stacklevel=2)
        if not self.fine_tunes:
            return self.pretrain(X)
        if y is None:
            raise ValueError(f"y is None, but fine-tuning ({self.finetune_epochs} epochs) needs labels; "
                             f"finetune_epochs=0 pre-trains only")
        label_indices(y, n_samples=X.shape[0], n_classes=self.n_classes, classes=self.learned("classes_"))
        self.pretrain(X)
        return self.finetune(X, y, validation_data=validation_data)

    def pretrain(self, X) -> "DBN":
        """Greedy layer-wise CD training; each layer learns on the one below's mean-field output."""
        self.validate_params()
        data = self._check_X(self._rows(X, record=True), fitted=False)
        self._check_inputs(n_features=data.shape[1])
        self.n_features_in_ = data.shape[1]
        self.rbms_, self.network_ = [], None
        for layer in range(len(self.hidden_layers)):
            rbm = self.make_rbm(layer)
            rbm.initialize(data)
            start = time.perf_counter()
            for epoch in range(self.pretrain_epochs):
                stats = rbm.train_epoch(data, epoch, checked=True)
                self._report({
                    "phase": "pretrain", "layer": layer, "epoch": epoch,
                    "reconstruction_error": stats.reconstruction_error,
                    "samples": stats.n_samples, "seconds": time.perf_counter() - start,
                })
                check_epoch(stats.reconstruction_error, "reconstruction error", "pretrain", epoch, layer=layer,
                            rate=rbm.learning_rate, gaussian=rbm.visible == "gaussian")
            self.rbms_.append(rbm)
            if layer + 1 < len(self.hidden_layers):
                data = rbm.hidden_probs(data)
        return self

    def finetune(self, X, y, *, validation_data=None) -> "DBN":
        """Backprop fine-tuning of the pre-trained stack with a softmax output layer.

        ``validation_data``: ``(X_valid, y_valid)`` in the form of ``(X, y)``, scored after each
        epoch (``valid_error``) and used by ``early_stopping_patience``, instead of the
        ``validation_fraction`` held out of ``X`` (set one or the other)."""
        if not self.rbms_:
            raise RuntimeError("finetune needs a pre-trained model: call pretrain() or fit() first")
        self.validate_params()
        be = self.backend
        X = self._check_X(self._rows(X))
        classes = self.learned("classes_")
        y, found = label_indices(y, n_samples=X.shape[0], n_classes=self.n_classes, classes=classes)
        if classes is None and found is not None:  # string labels: their sorted values are the classes
            classes = np.asarray(found.classes)
        if self.network_ is not None:
            n_classes = self.network_.n_classes
        else:  # with classes_ set, every class gets an output, those absent from y too
            n_classes = self.n_classes or (len(classes) if classes is not None else int(y.max()) + 1)
        if classes is not self.learned("classes_"):
            self.set_inputs(scaler=self.learned("input_scaler_"), classes=classes,
                            columns=self.learned("input_columns_"), widths=self.learned("input_widths_"))
        self._check_inputs(n_classes=n_classes)
        self.n_classes_ = n_classes
        y = check_labels(y, n_samples=X.shape[0], n_classes=self.n_classes_)
        X_train, y_train, X_valid, y_valid = self._split_validation(X, y)
        if validation_data is not None:
            if self.validation_fraction:
                raise ValueError("validation_data and validation_fraction both set: choose one validation set")
            X_valid = self._check_X(validation_data[0], name="validation X")
            if classes is None:  # class indices, as the training labels were (text would map itself)
                y_valid = check_labels(validation_data[1], n_samples=X_valid.shape[0], n_classes=self.n_classes_,
                                       name="validation y")
            else:
                y_valid, _ = label_indices(validation_data[1], n_samples=X_valid.shape[0], n_classes=self.n_classes_,
                                           classes=classes, name="validation y")

        if self.network_ is None:  # the pre-trained stack plus a fresh softmax layer
            pretrained = self.get_state(increments=False)
            softmax = be.normal((self.hidden_layers[-1], self.n_classes_), scale=0.01)
            n = len(self.rbms_)
            pretrained[state.net_name(n, "weights")] = be.to_numpy(softmax)
            self.network_ = Network.from_state(state.finetune_start(pretrained, n), n + 1, be)
        net = self.network_
        dropout = [self.input_dropout] + [self.dropout] * len(self.hidden_layers)
        y_train_dev = be.asarray(y_train, dtype=np.int64)
        best_error, best_state, since_best = np.inf, None, 0
        start = time.perf_counter()
        for epoch in range(self.finetune_epochs):
            top_only = epoch < self.top_layer_epochs
            learning_rate, momentum = self.finetune_schedule(epoch)
            stats = net.train_epoch(
                X_train, y_train_dev, epoch,
                learning_rate=learning_rate, momentum=momentum, max_norm=self.max_norm,
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
            check_epoch(stats.loss, "the loss", "finetune", epoch, rate=learning_rate)
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

    def transform(self, X) -> np.ndarray:
        """Top hidden layer's mean-field activations (fine-tuned weights when fine-tuned) of raw rows ``X``."""
        self._require_fitted()
        data = self._input_X(X)
        if self.network_ is None:
            for rbm in self.rbms_:
                data = rbm.hidden_probs(data)
            return self.backend.to_numpy(data)
        net, be = self.network_, self.backend
        for w, b in zip(net.weights[:-1], net.biases[:-1]):
            data = data @ w
            data += b
            be.sigmoid(data, out=data)
        return be.to_numpy(data)

    def predict_proba(self, X) -> np.ndarray:
        """Class probabilities of raw rows ``X``, shape (n_samples, n_classes); column i is class i
        (``classes_[i]``)."""
        self._require_classifier()
        return self.backend.to_numpy(self.network_.predict_proba_device(self._input_X(X)))

    def predict(self, X) -> np.ndarray:
        """Most probable class of each raw row: its label value from ``classes_`` when set, else its index."""
        indices = self.predict_proba(X).argmax(axis=1)
        classes = self.learned("classes_")
        return indices if classes is None else classes[indices]

    def score(self, X, y) -> float:
        """Accuracy on raw rows ``X`` and labels ``y`` (1 - error rate): label values of ``classes_``
        when set (one that is not a class is a DataError naming it), else class indices."""
        self._require_classifier()
        X = self._input_X(X)
        return 1.0 - self._error(X, self._class_indices(y, X.shape[0]))

    def _error(self, X, y) -> float:
        probs = self.network_.predict_proba_device(X)
        predicted = self.backend.to_numpy(probs.argmax(axis=1))
        return float(np.mean(predicted != y))

    def _require_fitted(self) -> None:
        if not self.rbms_ and self.network_ is None:
            raise RuntimeError("this DBN is not fitted yet: call fit() or pretrain() first")

    def _require_classifier(self) -> None:
        if self.network_ is None:
            raise RuntimeError("this DBN has no classifier: it is pre-trained only (finetune_epochs=0; transform() "
                               "gives its features), or not fitted yet: call fit() or finetune() first")

    # --------------------------------------------------------------- state

    def get_state(self, *, increments: bool = True) -> dict[str, np.ndarray]:
        """The learned arrays as a flat state of host NumPy arrays, under the names of
        :mod:`dbn.model.state`: the RBMs and, once fine-tuned, the network;
        ``increments=False`` leaves out the momentum increments (what a model file holds)."""
        arrays = {}
        for layer, rbm in enumerate(self.rbms_):
            arrays.update(state.named_rbm_state(layer, rbm.get_state()))
        if self.network_ is not None:
            arrays.update(self.network_.get_state())
        return arrays if increments else {k: v for k, v in arrays.items() if not state.is_increment(k)}

    def set_state(self, arrays: dict) -> "DBN":
        """Set ``rbms_``, ``network_``, ``n_features_in_`` and ``n_classes_`` from a flat state.

        It must hold an RBM for each of ``hidden_layers``; the network is built when
        ``net.0.weights`` is there (a program's state before fine-tuning holds only the
        softmax layer's initial weights, which is no network yet).
        """
        n = len(self.hidden_layers)
        self.rbms_ = [self.make_rbm(layer).set_state(state.rbm_state(arrays, layer)) for layer in range(n)]
        self.n_features_in_ = self.rbms_[0].n_visible
        has_network = state.net_name(0, "weights") in arrays
        self.network_ = Network.from_state(arrays, n + 1, self.backend) if has_network else None
        if self.network_ is not None:
            self.n_classes_ = self.network_.n_classes
        return self

    # --------------------------------------------------------- persistence

    def save(self, path) -> None:
        """Write the model to ``path`` (.npz + JSON header, no pickle), atomically.

        The arrays are the learned state under the names of :mod:`dbn.model.state`
        (without momentum increments); the header holds the hyperparameters, except
        ``callback``. A model with a scaler, classes or columns (:meth:`set_inputs`) adds them in
        the form of :mod:`dbn.model.preprocess`, as file format version 3, which older
        readers refuse rather than predict from unscaled rows; others stay version 2.
        """
        self._require_fitted()
        inputs, input_arrays = preprocess.to_file(self.learned("input_scaler_"), self.learned("classes_"),
                                                  self.learned("input_columns_"), self.learned("input_widths_"))
        header = {
            "params": {k: v for k, v in self.get_params().items() if k != "callback"},
            "n_features_in": self.n_features_in_,
            "n_classes": self.learned("n_classes_"),
            "has_network": self.network_ is not None,
            **inputs,
        }
        version = persist.INPUTS_VERSION if inputs else persist.VERSION
        persist.save_arrays(path, header, {**self.get_state(increments=False), **input_arrays}, version=version)

    @classmethod
    def load(cls, path, device: str = "auto") -> "DBN":
        """Read a model written by :meth:`save`, onto ``device`` (a GPU-trained model loads on a CPU).

        Files of format version 1 (before the names of :mod:`dbn.model.state`) and 2
        (no scaler or classes: the model has none) load too.
        """
        header, arrays = persist.load_arrays(path)
        try:
            if header.get("version", 1) < 2:
                arrays = state.from_version_1(arrays)
            model = cls(**{**header["params"], "device": device}).validate_params()
            model.set_state(arrays)
            if (model.network_ is not None) != header["has_network"]:
                raise ValueError(f"has_network is {header['has_network']} but the arrays say otherwise")
            scaler, classes, columns, widths = preprocess.from_file(header, arrays)
            if any(x is not None for x in (scaler, classes, columns)):  # else none, as on a model just fitted
                model.set_inputs(scaler=scaler, classes=classes, columns=columns, widths=widths)
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{path}: model file is inconsistent: {exc!r}") from exc
        return model
