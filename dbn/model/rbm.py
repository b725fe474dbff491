"""Restricted Boltzmann Machine trained with contrastive divergence.

Hinton's rbm.m in array form, on NumPy or CuPy. A minibatch is a block of rows, held
in buffers whose halves ([v0; vk], [h0; hk]) are contiguous, so that the sigmoids run
as fused passes (:mod:`dbn.model.kernels`) and the gradient is one product.

The unit of work the distributed runtime needs is :meth:`RBM.train_epoch`: from
the current parameters (:meth:`get_state` / :meth:`set_state`), run one epoch, or
a range of its minibatches, on this data and report the sample count.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from ..data.validation import check_features
from .base import Estimator
from .graphs import StepGraphs
from .minibatch import chunks, minibatches
from .state import RBM_KEYS, is_increment, logit

VISIBLE_UNITS = ("bernoulli", "gaussian")


@dataclass
class EpochStats:
    """What one call of :meth:`RBM.train_epoch` did."""

    epoch: int
    n_samples: int
    reconstruction_error: float  # mean over samples of sum_i (v0_i - v1_i)^2
    free_energy_gap: float | None = None  # held-out minus training free energy


class RBM(Estimator):
    """Restricted Boltzmann Machine with Bernoulli hidden units.

    Parameters
    ----------
    n_hidden : int
        Number of hidden units.
    visible : "bernoulli" or "gaussian"
        Bernoulli visible units take data in [0, 1]; Gaussian (unit variance)
        visible units take real-valued data, best standardised per feature.
    cd_k : int
        Gibbs steps in the negative phase (CD-k).
    persistent : bool
        Persistent CD: the negative chain carries over between minibatches.
    learning_rate, momentum, final_momentum, momentum_epoch :
        SGD with momentum; ``momentum`` is used before epoch ``momentum_epoch``
        and ``final_momentum`` from then on (Hinton: 0.5, then 0.9 after 5).
    weight_cost : float
        L2 penalty on the weights (not the biases).
    batch_size, epochs : int
        Minibatch size and number of passes over the data. Each epoch visits a
        fresh shuffle; samples left over after the last full batch wait for the
        next epoch's shuffle.
    init_std : float
        Weights start as ``init_std * N(0, 1)`` (0.1 as in Hinton's rbm.m: with the
        practical guide's 0.01 the nearly identical hidden units of a wide layer,
        such as 500->2000, update in step and diverge at learning rate 0.1).
        Biases start at zero, except the
        Bernoulli visible biases, which start at log(p / (1 - p)) of the data.
    device : "cpu", "gpu" or "auto"
    seed : int
        Seeds initialisation, shuffling and sampling.

    Learned attributes
    ------------------
    weights_ (n_visible, n_hidden), visible_bias_ (n_visible,), hidden_bias_ (n_hidden,)
        Device arrays (NumPy or CuPy); :meth:`get_state` returns NumPy copies.
    history_ : list of EpochStats

    The arguments of ``__init__`` are kept as given (:meth:`get_params` /
    :meth:`set_params`) and checked by :meth:`validate_params` when training starts.
    """

    def __init__(
        self,
        n_hidden: int,
        *,
        visible: str = "bernoulli",
        cd_k: int = 1,
        persistent: bool = False,
        learning_rate: float = 0.1,
        # One schedule: momentum until epoch momentum_epoch, final_momentum from then on.
        momentum: float = 0.5, final_momentum: float = 0.9, momentum_epoch: int = 5,
        weight_cost: float = 2e-4,
        batch_size: int = 100,
        epochs: int = 50,
        init_std: float = 0.1,
        device: str = "auto",
        dtype: str = "float32",
        seed: int = 0,
    ):
        self._store_params(locals())
        self.history_: list[EpochStats] = []
        self._buffers: dict[int, dict] = {}
        self._chain = None

    def validate_params(self) -> "RBM":
        """Check the hyperparameters (``fit``, ``initialize`` and ``train_epoch`` call it); returns self."""
        if self.visible not in VISIBLE_UNITS:
            raise ValueError(f"visible must be one of {VISIBLE_UNITS}, got {self.visible!r}")
        for name in ("n_hidden", "cd_k", "batch_size", "epochs"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in ("n_hidden", "cd_k", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {self.epochs!r}")
        return self

    # ------------------------------------------------------------------ set-up

    @property
    def n_visible(self) -> int:
        return int(self.weights_.shape[0])

    def initialize(self, X=None, n_visible: int | None = None) -> "RBM":
        """Draw initial parameters; ``X`` (optional) sets the visible biases."""
        if X is None and n_visible is None:
            raise ValueError("initialize needs data X or n_visible")
        self.validate_params()
        be, xp = self.backend, self.backend.xp
        if X is not None:
            X = self._check(X, fitted=False)
            n_visible = X.shape[1]
        n_visible = int(n_visible)
        self._buffers.clear()
        self.weights_ = be.normal((n_visible, self.n_hidden), scale=self.init_std)
        self.hidden_bias_ = be.zeros(self.n_hidden)
        self.visible_bias_ = be.zeros(n_visible)
        if X is not None and self.visible == "bernoulli":
            self.visible_bias_ = logit(xp.mean(X, axis=0), xp).astype(be.dtype)
        self._reset_increments()
        return self

    def _reset_increments(self) -> None:
        xp = self.backend.xp
        self.weights_inc_ = xp.zeros_like(self.weights_)
        self.visible_bias_inc_ = xp.zeros_like(self.visible_bias_)
        self.hidden_bias_inc_ = xp.zeros_like(self.hidden_bias_)
        self._chain = None

    def get_state(self, on_device: bool = False) -> dict[str, np.ndarray]:
        """Parameters and momentum increments as host NumPy arrays; ``on_device``: the RBM's own
        device arrays, no copy (read them before it trains again)."""
        if on_device:
            return {key: getattr(self, key + "_") for key in RBM_KEYS}
        return {key: self.backend.to_numpy(getattr(self, key + "_")) for key in RBM_KEYS}

    def set_state(self, state: dict) -> "RBM":
        """Load parameters (and increments, zero when absent) onto the device. Arrays whose
        shapes match are overwritten in place, so a worker that loads each superstep's state
        keeps its buffers and its captured CUDA graphs (:mod:`dbn.model.graphs`)."""
        be = self.backend
        shape = np.shape(state["weights"])
        if len(shape) != 2 or shape[1] != self.n_hidden:
            raise ValueError(f"state weights have shape {shape}, expected (n_visible, {self.n_hidden})")
        if self.learned("weights_") is None or self.weights_.shape != shape:
            self._buffers.clear()  # sized by n_visible
        for key in RBM_KEYS:
            current = getattr(self, key + "_", None)
            if key in state:
                setattr(self, key + "_", be.load(current, state[key]))
            elif is_increment(key):  # zero, shaped as its parameter
                setattr(self, key + "_", be.zeroed(current, getattr(self, key.removesuffix("_inc") + "_")))
            else:
                raise KeyError(f"state has no {key!r}")
        self._chain = None
        return self

    def _check(self, X, fitted: bool = True):
        n_features = self.n_visible if fitted else None
        X = check_features(X, n_features=n_features, unit_interval=self.visible == "bernoulli")
        return self.backend.asarray(X)

    # ---------------------------------------------------------------- training

    def fit(self, X, X_valid=None, callback=None) -> "RBM":
        """Initialise and train for ``epochs`` epochs.

        ``X_valid`` (optional) is a held-out set: each epoch then reports the gap
        between its mean free energy and that of as many training samples, the
        overfitting signal of Hinton's practical guide. ``callback(stats)`` is
        called after every epoch.
        """
        self.validate_params()
        X = self._check(X, fitted=False)
        self.initialize(X)
        self.history_ = []
        if X_valid is not None:
            X_valid = self._check(X_valid)
        for epoch in range(self.epochs):
            stats = self.train_epoch(X, epoch, checked=True)
            if X_valid is not None:
                stats.free_energy_gap = self.free_energy_gap(X, X_valid)
            if callback is not None:
                callback(stats)
        return self

    def train_epoch(self, X, epoch: int, batches: range | None = None, *, checked: bool = False) -> EpochStats:
        """Run CD-k over one epoch of ``X``, or over the minibatches in ``batches``.

        Minibatch ``i`` of epoch ``e`` is the same for every caller with the same
        seed, so workers syncing every k minibatches can each run ``range(i, i+k)``.
        Returns the number of samples seen and their mean reconstruction error.
        """
        if not hasattr(self, "weights_"):
            raise RuntimeError("RBM is not initialised: call fit(), initialize() or set_state() first")
        self.validate_params()
        X = X if checked else self._check(X)
        n = X.shape[0]
        batch = min(self.batch_size, n)
        batches = range(n // batch) if batches is None else batches
        momentum = self.momentum if epoch < self.momentum_epoch else self.final_momentum
        buf = self._buffers_for(batch)
        error = buf["error"]  # summed on the device: no wait for the GPU until the epoch ends
        error[...] = 0
        step = self._step(batch, momentum)
        for _ in minibatches(X, self.epoch_order(n, epoch), batch, batches, buf["V"][:batch], self.backend):
            step()
        n_seen = len(batches) * batch
        stats = EpochStats(epoch, n_seen, float(error) / max(n_seen, 1))
        self.history_.append(stats)
        return stats

    def epoch_order(self, n: int, epoch: int) -> np.ndarray:
        """The order in which epoch ``epoch`` visits ``n`` rows: (seed, epoch) alone decide it."""
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def _buffers_for(self, batch: int) -> dict:
        """Work arrays reused by every minibatch of this size (no allocation per step)."""
        if batch not in self._buffers:
            be, nv, nh = self.backend, self.n_visible, self.n_hidden
            self._buffers[batch] = {
                "V": be.empty((2 * batch, nv)),  # [v0; vk], one sample per row
                "H": be.empty((2 * batch, nh)),  # [h0; hk]
                "h_sample": be.empty((batch, nh)),
                "diff": be.empty((batch, nv)),
                "grad": be.empty((nv, nh)),
                "error": be.zeros(()),
                "graphs": StepGraphs(),
            }
        return self._buffers[batch]

    def _step(self, B: int, momentum: float):
        """The function that runs one CD step on the minibatch in the ``V`` buffer and adds its
        reconstruction error to the ``error`` buffer: on the GPU a CUDA graph
        (:mod:`dbn.model.graphs`), keyed by everything the graph bakes in."""
        buf = self._buffers_for(B)
        xp, error = self.backend.xp, buf["error"]

        def step():
            xp.add(error, self._cd_step(B, momentum), out=error)

        # A persistent chain is a new array each step: no fixed address for a graph.
        if not self.backend.graphs or self.persistent:
            return step
        return buf["graphs"].bind(step, (momentum, self.learning_rate, self.weight_cost, self.cd_k, self.visible),
                                  [getattr(self, key + "_") for key in RBM_KEYS] + [self.backend.random_state])

    def _visible(self, h, out):
        """Visible units given hidden states ``h``: probabilities, or Gaussian means."""
        self.backend.matmul(h, self.weights_.T, out=out)
        if self.visible == "bernoulli":
            return self.backend.sigmoid(out, out=out, bias=self.visible_bias_)
        out += self.visible_bias_  # Gaussian units: the mean, as the practical guide recommends
        return out

    def _hidden(self, v, out):
        """Hidden unit probabilities given visible states ``v``."""
        self.backend.matmul(v, self.weights_, out=out)
        return self.backend.sigmoid(out, out=out, bias=self.hidden_bias_)

    def _cd_step(self, B: int, momentum: float):
        """One CD-k update on the minibatch of ``B`` rows in the first half of the ``V`` buffer;
        returns its summed squared reconstruction error.

        Rows are samples, and each buffer half is contiguous, so the sigmoids run as fused
        passes between the four products (hidden, visible, hidden, gradient)."""
        be, xp = self.backend, self.backend.xp
        buf = self._buffers_for(B)
        V, H = buf["V"], buf["H"]
        v0, vk, h0, hk = V[:B], V[B:], H[:B], H[B:]

        self._hidden(v0, out=h0)  # positive phase
        # Negative phase: k Gibbs steps from sampled hiddens (or the persistent chain).
        h = self._chain if self.persistent and self._chain is not None else h0
        for _ in range(self.cd_k):
            h = self._sample(h, buf["h_sample"])
            self._visible(h, out=vk)
            h = self._hidden(vk, out=hk)
        if self.persistent:
            self._chain = self._sample(hk, be.empty(hk.shape))
            # vk belongs to the persistent chain, not to this batch: measure the
            # reconstruction of v0 itself (one more product, PCD only).
            recon = self._visible(h0, out=buf["diff"])
            diff = xp.subtract(v0, recon, out=recon)
        else:
            diff = xp.subtract(v0, vk, out=buf["diff"])
        diff = diff.ravel()
        error = xp.vdot(diff, diff)

        # Gradient <v h>_data - <v h>_model as one product of the stacked rows, with
        # lr / B folded into H so that the update needs no extra scaling pass.
        scale = self.learning_rate / B
        h0 *= scale
        hk *= -scale
        grad = be.matmul(V.T, H, out=buf["grad"])
        grad_hidden = H.sum(axis=0)
        grad_visible = scale * (v0.sum(axis=0) - vk.sum(axis=0))

        be.momentum_step(self.weights_, self.weights_inc_, grad, momentum, self.learning_rate * self.weight_cost)
        be.momentum_step(self.visible_bias_, self.visible_bias_inc_, grad_visible, momentum)
        be.momentum_step(self.hidden_bias_, self.hidden_bias_inc_, grad_hidden, momentum)
        return error

    def _sample(self, p, out):
        """Bernoulli samples of probabilities ``p`` (as 0.0 / 1.0) written to ``out``."""
        self.backend.uniform(out)
        return self.backend.xp.less(out, p, out=out)

    # -------------------------------------------------------------- inference

    def transform(self, X):
        """Hidden unit probabilities (mean-field) for ``X``: the next layer's input.

        Returns an array on the model's device.
        """
        X = self._check(X)
        return self.hidden_probs(X)

    def hidden_probs(self, X):
        """Hidden probabilities of every row of ``X`` (a device array), in blocks of
        :data:`~dbn.model.minibatch.CHUNK_ROWS` rows."""
        out = self.backend.empty((X.shape[0], self.n_hidden))
        for start, block in chunks(X, self.backend):
            self._hidden(block, out=out[start:start + block.shape[0]])
        return out

    def hidden_probs_chunks(self, X):
        """Hidden probabilities of ``X`` (in memory or streamed) block by block, as host
        arrays, for writing to disk: the same blocks and bits as :meth:`hidden_probs`."""
        be = self.backend
        for _, block in chunks(X, be):
            yield be.to_numpy(self._hidden(block, out=be.empty((block.shape[0], self.n_hidden))))

    def reconstruct(self, X):
        """Mean-field reconstruction of ``X`` through the hidden layer."""
        be = self.backend
        h = self.transform(X)
        v = h @ self.weights_.T + self.visible_bias_
        return be.sigmoid(v, out=v) if self.visible == "bernoulli" else v

    def free_energy(self, X):
        """Free energy of each row of ``X`` (lower means more probable under the model)."""
        xp = self.backend.xp
        X = self._check(X)
        softplus = xp.logaddexp(0, X @ self.weights_ + self.hidden_bias_).sum(axis=1)
        if self.visible == "bernoulli":
            return -(X @ self.visible_bias_) - softplus
        return 0.5 * ((X - self.visible_bias_) ** 2).sum(axis=1) - softplus

    def free_energy_gap(self, X_train, X_valid, n: int = 1000) -> float:
        """Mean free energy of held-out data minus that of as many training rows.

        A gap that grows during training means the RBM is overfitting.
        """
        m = min(n, X_train.shape[0], X_valid.shape[0])
        return float(self.free_energy(X_valid[:m]).mean() - self.free_energy(X_train[:m]).mean())
