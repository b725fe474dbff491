"""Several networks of one shape fine-tuned in lockstep, as one computation (issue 54, part 1).

The fine-tuning half of :mod:`dbn.model.rbm_group`: the members' layers stacked on the device
(``(G, in, out)``), each layer's forward product, its two backward products and the momentum
updates as one batched operation over the stack. What makes a member's results its own stays
its own: its minibatch order, its dropout draws (each member has a random stream of its own, drawn
in the order its network alone would draw), its loss and errors, and the reductions over a
minibatch's rows (the softmax, the bias gradients, max-norm). Member ``g`` ends an epoch with the
bits :meth:`~dbn.model.network.Network.train_epoch` gives it alone (``tests/test_rbm_group.py``).
"""

from __future__ import annotations

import numpy as np

from . import kernels
from .minibatch import minibatches
from .network import FinetuneStats, Network, clip_columns
from .rbm_group import GroupError

#: A member's arrays, as the group stacks them: each a list of one array a layer.
STACKED = ("weights", "biases", "weights_inc", "biases_inc")


class NetworkGroup:
    """``members`` (networks of one shape on one device) trained in lockstep; their parameters
    become views of the group's stacks, so ``set_state`` and ``get_state`` of a member load into
    and read from what the group trains."""

    def __init__(self, members: list[Network]):
        if not members:
            raise GroupError("a group needs at least one network")
        shapes = {tuple(tuple(w.shape) for w in net.weights) for net in members}
        if len(shapes) != 1:
            raise GroupError(f"the networks differ in shape ({sorted(shapes)}): they cannot train as one group")
        self.members = list(members)
        self.backend = members[0].backend
        xp = self.backend.xp
        for key in STACKED:
            stacks = [xp.stack([getattr(net, key)[i] for net in members]) for i in range(len(members[0].weights))]
            setattr(self, key, stacks)
            for g, net in enumerate(members):
                getattr(net, key)[:] = [stack[g] for stack in stacks]
        self._buffers: dict[tuple, object] = {}

    @property
    def size(self) -> int:
        return len(self.members)

    def holds(self, members: list[Network]) -> bool:
        """Whether this group is still ``members``' (the same networks, each holding views of its slices)."""
        return (len(members) == self.size and all(a is b for a, b in zip(members, self.members))
                and all(array.base is stack for net in members for key in STACKED
                        for array, stack in zip(getattr(net, key), getattr(self, key))))

    def _buffer(self, name: str, shape: tuple, dtype=None):
        key = (name, shape, dtype)
        if key not in self._buffers:
            self._buffers[key] = self.backend.empty(shape, dtype)
        return self._buffers[key]

    def train_epoch(self, Xs: list, ys: list, epoch: int, *, learning_rate: float, momentum: float,
                    weight_cost: float = 0.0, max_norm: float = 0.0, batch_size: int = 100, dropout=(),
                    train_layers: slice = slice(None), seeds: list[int], streams: list, batches: range | None = None
                    ) -> list[FinetuneStats]:
        """One epoch (or the minibatches ``batches``) of every member, as
        :meth:`Network.train_epoch` runs it for member ``g`` on ``Xs[g]``, ``ys[g]`` with order seed
        ``seeds[g]`` and its dropout drawn from ``streams[g]`` (a backend reseeded as the member's
        own would be). Members whose data make minibatches of different sizes or numbers cannot
        step together: a :class:`GroupError`, before anything is trained."""
        be, xp = self.backend, self.backend.xp
        sizes = [int(X.shape[0]) for X in Xs]
        batch = min(batch_size, min(sizes))
        if any(min(batch_size, n) != batch or n // batch != sizes[0] // batch for n in sizes):
            raise GroupError(f"the members' data ({sizes} rows) make minibatches of different sizes or numbers "
                             f"at batch size {batch_size}")
        batches = range(sizes[0] // batch) if batches is None else batches
        G = self.size
        layers = range(len(self.weights))[train_layers]
        rows = self._buffer("rows", (G, batch, Xs[0].shape[1]))
        labels = self._buffer("labels", (G, batch), np.int64)
        every = xp.arange(batch)
        total_loss = [be.zeros(()) for _ in range(G)]
        errors = [be.zeros((), np.int64) for _ in range(G)]

        def update(j, step_w, step_b):
            if j not in layers:
                return
            be.momentum_step(self.weights[j], self.weights_inc[j], step_w, momentum, learning_rate * weight_cost)
            be.momentum_step(self.biases[j], self.biases_inc[j], step_b, momentum)
            if max_norm:
                for g in range(G):
                    clip_columns(self.weights[j][g], max_norm, xp)

        feeds = [minibatches(X, np.random.default_rng([seed, epoch, 1]).permutation(int(X.shape[0])), batch, batches,
                             rows[g], be, labels=y) for g, (X, y, seed) in enumerate(zip(Xs, ys, seeds))]
        for fed in zip(*feeds):
            for g, (_, member_labels) in enumerate(fed):
                labels[g] = member_labels
            acts, inputs = self._forward(rows, dropout, streams)
            probs = acts[-1]
            delta = probs.copy()
            for g in range(G):
                xp.subtract(total_loss[g], xp.sum(xp.log(xp.maximum(probs[g][every, labels[g]], 1e-30))),
                            out=total_loss[g])
                xp.add(errors[g], (probs[g].argmax(axis=1) != labels[g]).sum(), out=errors[g])
                delta[g][every, labels[g]] -= 1
            delta *= -learning_rate / batch
            self._backward(acts, inputs, delta, dropout, lowest=min(layers, default=0), apply=update)
        n_seen = len(batches) * batch
        return [FinetuneStats(epoch, n_seen, float(loss) / max(n_seen, 1), int(wrong) / max(n_seen, 1))
                for loss, wrong in zip(total_loss, errors)]

    def _forward(self, x, dropout, streams):
        """The members' activations (``(G, rows, units)`` a layer) and what each layer multiplied,
        as :meth:`Network._forward` in training."""
        be, xp = self.backend, self.backend.xp
        activations, inputs = [x], []
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            a = activations[-1]
            p = dropout[i] if i < len(dropout) else 0.0
            if p > 0:
                uniforms = self._buffer("uniforms", a.shape)
                for g, stream in enumerate(streams):  # each member's draws, in its own order
                    stream.uniform(uniforms[g])
                a = kernels.dropout(a, uniforms, p, out=self._buffer(f"dropped input {i}", a.shape), xp=xp)
            inputs.append(a)
            z = be.matmul(a, w)
            for g in range(self.size):  # per member: the fused sigmoid is two-dimensional, the softmax reduces rows
                if i < last:
                    be.sigmoid(z[g], out=z[g], bias=b[g])
                else:
                    zg = z[g]
                    zg += b[g]
                    zg -= zg.max(axis=1, keepdims=True)
                    xp.exp(zg, out=zg)
                    zg /= zg.sum(axis=1, keepdims=True)
            activations.append(z)
        return activations, inputs

    def _backward(self, activations, inputs, delta, dropout, lowest: int, apply) -> None:
        """As :meth:`Network._backward` with ``apply``: each layer's steps as soon as backprop is past it."""
        xp = self.backend.xp
        for i in reversed(range(lowest, len(self.weights))):
            grad_w = self.backend.matmul(inputs[i].transpose(0, 2, 1), delta)
            grad_b = xp.stack([delta[g].sum(axis=0) for g in range(self.size)])
            if i > lowest:
                delta = self.backend.matmul(delta, self.weights[i].transpose(0, 2, 1))
                dropped = inputs[i] is not activations[i]
                kernels.sigmoid_backward_(delta, activations[i], inputs[i] if dropped else None,
                                          1.0 / (1.0 - dropout[i]) if dropped else 1.0, xp=xp)
            apply(i, grad_w, grad_b)
