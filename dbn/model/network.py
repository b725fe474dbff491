"""The feed-forward network that backprop fine-tunes: sigmoid hidden layers, softmax output.

Like the RBM, a minibatch is a block of rows (samples x features) and the unit of work for
the distributed runtime is :meth:`Network.train_epoch` from the current
parameters (:meth:`get_state` / :meth:`set_state`, under the names of :mod:`dbn.model.state`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernels
from .backend import Backend
from .graphs import StepGraphs
from .minibatch import minibatches
from .state import NET_KEYS, net_name


@dataclass
class FinetuneStats:
    """What one call of :meth:`Network.train_epoch` did."""

    epoch: int
    n_samples: int
    loss: float  # mean cross-entropy of the minibatches as trained (dropout on)
    train_error: float  # fraction misclassified in those minibatches


def clip_columns(w, max_norm: float, xp=np) -> None:
    """In place: scale every column of ``w`` longer than ``max_norm`` (Euclidean) back to it."""
    # CuPy's einsum is a batched cuBLAS product, which a CUDA graph cannot capture (kernels.gpu_matmul).
    norms = xp.sqrt(xp.einsum("ij,ij->j", w, w) if xp is np else (w * w).sum(axis=0))
    w *= xp.minimum(1, max_norm / xp.maximum(norms, xp.finfo(w.dtype).tiny)).astype(w.dtype)


class Network:
    """Sigmoid hidden layers and a softmax output layer, trained by SGD with momentum.

    ``weights[i]`` has shape (n_in, n_out) and ``biases[i]`` shape (n_out,); the last
    pair is the softmax layer. All arrays live on ``backend``'s device.
    """

    def __init__(self, weights, biases, backend: Backend):
        if len(weights) != len(biases) or not weights:
            raise ValueError("a network needs matching, non-empty lists of weights and biases")
        self.backend = backend
        self.weights = [backend.copy(w) for w in weights]
        self.biases = [backend.copy(b) for b in biases]
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if w.ndim != 2 or b.shape != (w.shape[1],):
                raise ValueError(f"layer {i}: weights {w.shape} and bias {b.shape} do not match")
            if i and w.shape[0] != self.weights[i - 1].shape[1]:
                raise ValueError(f"layer {i} takes {w.shape[0]} inputs but layer {i - 1} gives {self.weights[i - 1].shape[1]}")
        xp = backend.xp
        self.weights_inc = [xp.zeros_like(w) for w in self.weights]
        self.biases_inc = [xp.zeros_like(b) for b in self.biases]
        self._buffers: dict[tuple, object] = {}
        self._graphs = StepGraphs()

    def _buffer(self, name: str, shape: tuple, dtype=None):
        """A work array that every step with this shape reuses (no allocation per step)."""
        key = (name, shape, dtype)
        if key not in self._buffers:
            self._buffers[key] = self.backend.empty(shape, dtype)
        return self._buffers[key]

    @property
    def n_classes(self) -> int:
        return int(self.weights[-1].shape[1])

    # ---------------------------------------------------------------- state

    @classmethod
    def from_state(cls, state: dict, n_layers: int, backend: Backend) -> "Network":
        """The network of layers ``net.0`` to ``net.{n_layers - 1}`` in a flat state (names of
        :mod:`dbn.model.state`; increments where present), on ``backend``'s device."""
        weights = [state[net_name(i, "weights")] for i in range(n_layers)]
        biases = [state[net_name(i, "biases")] for i in range(n_layers)]
        return cls(weights, biases, backend).set_state(state)

    def get_state(self, on_device: bool = False) -> dict[str, np.ndarray]:
        """Parameters and momentum increments as host NumPy arrays, under their flat names
        (``net.{i}.weights``, ..., see :mod:`dbn.model.state`); ``on_device``: the network's own
        device arrays, no copy (read them before it trains again)."""
        to_np = (lambda array: array) if on_device else self.backend.to_numpy
        return {net_name(i, key): to_np(getattr(self, key)[i]) for i in range(len(self.weights)) for key in NET_KEYS}

    def set_state(self, state: dict) -> "Network":
        """Load parameters (and increments, zero when absent) from flat names onto the device;
        other names in ``state`` are ignored. Arrays whose shapes match are overwritten in
        place (buffers and captured CUDA graphs that read them stay valid)."""
        be = self.backend
        for i in range(len(self.weights)):
            self.weights[i] = be.load(self.weights[i], state[net_name(i, "weights")])
            self.biases[i] = be.load(self.biases[i], state[net_name(i, "biases")])
            for key, param in (("weights_inc", self.weights[i]), ("biases_inc", self.biases[i])):
                name = net_name(i, key)
                increments = getattr(self, key)
                increments[i] = be.load(increments[i], state[name]) if name in state else be.zeroed(increments[i], param)
        return self

    # ------------------------------------------------------------- forward

    def _forward(self, x, dropout=(), train=False):
        """Activations of every layer for the row batch ``x`` (B, n_in).

        Returns (activations, inputs): ``activations[i]`` is layer i's output
        (``activations[0]`` is ``x``) and ``inputs[i]`` what layer i multiplied,
        which differs only under dropout. ``dropout[i]`` is the drop probability
        of layer i's input; kept units are scaled by 1/(1-p), so prediction
        needs no rescaling.
        """
        be, xp = self.backend, self.backend.xp
        activations, inputs = [x], []
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            a = activations[-1]
            p = dropout[i] if train and i < len(dropout) else 0.0
            if p > 0:
                uniforms = be.uniform(self._buffer("uniforms", a.shape))
                a = kernels.dropout(a, uniforms, p, out=self._buffer(f"dropped input {i}", a.shape), xp=xp)
            inputs.append(a)
            z = be.matmul(a, w)
            if i < last:
                be.sigmoid(z, out=z, bias=b)
            else:  # softmax over classes, stabilised
                z += b
                z -= z.max(axis=1, keepdims=True)
                xp.exp(z, out=z)
                z /= z.sum(axis=1, keepdims=True)
            activations.append(z)
        return activations, inputs

    def predict_proba_device(self, X, chunk: int = 4096):
        """Class probabilities for row matrix ``X`` (on the device), shape (n, n_classes)."""
        xp = self.backend.xp
        parts = [self._forward(X[start:start + chunk])[0][-1] for start in range(0, X.shape[0], chunk)]
        return parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=0)

    # ------------------------------------------------------------ training

    def _backward(self, activations, inputs, delta, dropout=(), lowest: int = 0, apply=None):
        """Weight and bias gradients of layers ``lowest`` and up for ``delta``, the gradient at
        the softmax's input (None below ``lowest``). Backprop is linear in ``delta``: scaled by
        ``-lr`` it gives ready-made steps.

        With ``apply``, ``apply(i, grad_w, grad_b)`` takes each layer's gradients as soon as the
        layers below no longer need its weights, instead of returning them: an update there finds
        the weights and the gradient still in cache (the same arithmetic as updating afterwards)."""
        xp = self.backend.xp
        grads_w, grads_b = [None] * len(self.weights), [None] * len(self.weights)
        for i in reversed(range(lowest, len(self.weights))):
            grad_w = self.backend.matmul(inputs[i].T, delta)
            grad_b = delta.sum(axis=0)
            if i > lowest:
                # Back through layer i's (dropped-out) input to the sigmoid below it.
                delta = self.backend.matmul(delta, self.weights[i].T)
                dropped = inputs[i] is not activations[i]
                kernels.sigmoid_backward_(delta, activations[i], inputs[i] if dropped else None,
                                          1.0 / (1.0 - dropout[i]) if dropped else 1.0, xp=xp)
            if apply is None:
                grads_w[i], grads_b[i] = grad_w, grad_b
            else:
                apply(i, grad_w, grad_b)
        return grads_w, grads_b

    def loss_and_grads(self, x, targets, weight_cost: float = 0.0, dropout=(), train=False):
        """Mean cross-entropy (+ L2 on weights) of the row batch ``x`` and its gradients.

        ``targets`` is one-hot (B, n_classes). Returns (loss, weight grads, bias
        grads, output probabilities); the gradient check test uses this directly.
        """
        xp = self.backend.xp
        B = x.shape[0]
        acts, inputs = self._forward(x, dropout, train)
        probs = acts[-1]
        loss = -float(xp.sum(targets * xp.log(xp.maximum(probs, 1e-30)))) / B
        if weight_cost:
            loss += 0.5 * weight_cost * sum(float(xp.vdot(w.ravel(), w.ravel())) for w in self.weights)
        grads_w, grads_b = self._backward(acts, inputs, (probs - targets) / B, dropout)
        if weight_cost:
            for g, w in zip(grads_w, self.weights):
                g += weight_cost * w
        return loss, grads_w, grads_b, probs

    def train_epoch(
        self,
        X,
        y,
        epoch: int,
        *,
        learning_rate: float,
        momentum: float,
        weight_cost: float = 0.0,
        max_norm: float = 0.0,
        batch_size: int = 100,
        dropout=(),
        train_layers: slice = slice(None),
        seed: int = 0,
        batches: range | None = None,
    ) -> FinetuneStats:
        """One epoch (or the minibatches in ``batches``) of SGD with momentum.

        ``X`` (n, n_in) is a device array or a streamed source (see :mod:`dbn.model.minibatch`);
        integer labels ``y`` (n,) are on the device, or on the host for streamed ``X``. Only the
        layers in ``train_layers`` are updated (Hinton trains the softmax layer
        alone for the first epochs). The shuffle depends only on (seed, epoch).
        Each step is ``inc = momentum * inc - lr * (grad + weight_cost * W)``, ``W += inc``;
        with ``max_norm`` every column of ``W`` (a unit's incoming weights) longer than it is
        then scaled back to that length.
        """
        be, xp = self.backend, self.backend.xp
        n = X.shape[0]
        batch = min(batch_size, n)
        n_batches = n // batch
        batches = range(n_batches) if batches is None else batches
        order = np.random.default_rng([seed, epoch, 1]).permutation(n)
        layers = range(len(self.weights))[train_layers]
        # Fixed buffers: the step reads and writes the same addresses every time (a CUDA graph
        # replays them); loss and error count are summed on the device until the epoch ends.
        rows_buffer = self._buffer("rows", (batch, X.shape[1]))
        labels_buffer = self._buffer("labels", (batch,), np.int64)
        every = self._buffer("every", (batch,), np.int64)
        every[...] = xp.arange(batch)
        total_loss, errors = self._buffer("loss", ()), self._buffer("errors", (), np.int64)
        total_loss[...] = 0
        errors[...] = 0

        def update(j, step_w, step_b):  # layer j's update, as soon as backprop is past it
            if j not in layers:
                return
            be.momentum_step(self.weights[j], self.weights_inc[j], step_w, momentum, learning_rate * weight_cost)
            be.momentum_step(self.biases[j], self.biases_inc[j], step_b, momentum)
            if max_norm:
                clip_columns(self.weights[j], max_norm, xp)

        def step():
            acts, inputs = self._forward(rows_buffer, dropout, train=True)
            probs = acts[-1]
            xp.subtract(total_loss, xp.sum(xp.log(xp.maximum(probs[every, labels_buffer], 1e-30))), out=total_loss)
            xp.add(errors, (probs.argmax(axis=1) != labels_buffer).sum(), out=errors)
            # delta = -lr * (probs - targets) / B: the gradients come out as steps.
            delta = probs.copy()
            delta[every, labels_buffer] -= 1
            delta *= -learning_rate / batch
            self._backward(acts, inputs, delta, dropout, lowest=min(layers, default=0), apply=update)

        if be.graphs:
            step = self._graphs.bind(step, (batch, learning_rate, momentum, weight_cost, max_norm, tuple(dropout),
                                            tuple(layers)),
                                     [*self.weights, *self.biases, *self.weights_inc, *self.biases_inc, be.random_state])
        for rows, labels in minibatches(X, order, batch, batches, rows_buffer, be, labels=y):
            labels_buffer[...] = labels
            step()
        n_seen = len(batches) * batch
        return FinetuneStats(epoch, n_seen, float(total_loss) / max(n_seen, 1), int(errors) / max(n_seen, 1))
