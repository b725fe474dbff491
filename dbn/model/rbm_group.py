"""Several RBMs of one shape trained in lockstep, as one computation (issue 54, part 1).

Where several workers' shards share a device, their RBMs can run each CD step together: the
parameters of the ``G`` members stacked on the device (``(G, visible, hidden)``), the four products
of a step as batched products of the stacked arrays (one ``matmul`` of ``(G, rows, visible)`` by
``(G, visible, hidden)``; on a GPU a strided-batched GEMM), and the momentum updates as one pass
over the stack. What stays a member's own is what makes its results its own: its minibatch order,
its random stream (the members' draws fill their own slices) and its reconstruction error.

So member ``g`` ends an epoch with exactly what its RBM would have reached alone on its shard: on
NumPy bit for bit (a stacked product is a loop of the same BLAS calls on the same slices, and the
elementwise passes are the same per element; ``tests/test_rbm_group.py`` checks it), which is what
lets the runtime hand the group's results on as the members' updates.

The members are :class:`~dbn.model.rbm.RBM` instances with the same hyperparameters (their seeds
differ), initialised or loaded (:meth:`~dbn.model.rbm.RBM.set_state`); the group rebinds their
parameters as views of its stacks, so a member's ``get_state`` reads what the group trained.
"""

from __future__ import annotations

from .minibatch import minibatches
from .rbm import RBM, EpochStats
from .state import RBM_KEYS

#: Hyperparameters the members of a group must share (the seed is each member's own).
SHARED_PARAMS = ("n_hidden", "visible", "cd_k", "persistent", "learning_rate", "momentum", "final_momentum",
                 "momentum_epoch", "weight_cost", "batch_size", "device", "dtype")


class GroupError(ValueError):
    """The RBMs or their data cannot run as one group (the caller runs them one by one)."""


class RBMGroup:
    """``members`` (RBMs of one shape and the same hyperparameters) trained in lockstep: see the
    module docstring. Persistent CD is not grouped (each chain is a new array every step)."""

    def __init__(self, members: list[RBM]):
        if not members:
            raise GroupError("a group needs at least one RBM")
        first = members[0]
        for rbm in members[1:]:
            differ = [name for name in SHARED_PARAMS if getattr(rbm, name) != getattr(first, name)]
            if differ:
                raise GroupError(f"the RBMs differ in {', '.join(differ)}: they cannot train as one group")
        if first.persistent:
            raise GroupError("persistent CD keeps one chain a member: its RBMs train one by one")
        shapes = {tuple(rbm.weights_.shape) for rbm in members}
        if len(shapes) != 1:
            raise GroupError(f"the RBMs' weights differ in shape ({sorted(shapes)}): they cannot train as one group")
        self.members = list(members)
        self.backend = first.backend
        xp = self.backend.xp
        for key in RBM_KEYS:  # the stacks, and each member's parameters as views of its slice
            stacked = xp.stack([getattr(rbm, key + "_") for rbm in members])
            setattr(self, key, stacked)
            for g, rbm in enumerate(members):
                setattr(rbm, key + "_", stacked[g])
        self._buffers: dict[int, dict] = {}

    @property
    def size(self) -> int:
        return len(self.members)

    def holds(self, members: list[RBM]) -> bool:
        """Whether this group is still ``members``' (the same RBMs, each still holding views of its
        slices: loading a state of another shape would have replaced them)."""
        return (len(members) == self.size and all(a is b for a, b in zip(members, self.members))
                and all(getattr(rbm, key + "_").base is getattr(self, key) for rbm in members for key in RBM_KEYS))

    def train_epoch(self, Xs: list, epoch: int, batches: range | None = None) -> list[EpochStats]:
        """Run CD-k over one epoch (or the minibatches ``batches``) of each member's data ``Xs[g]``
        (device arrays, checked as :meth:`RBM.train_epoch` checks them), all members at each step;
        returns each member's :class:`EpochStats`, as its own ``train_epoch`` would have. Members
        whose data make minibatches of different sizes or numbers cannot step together: a
        :class:`GroupError` says so before anything is trained."""
        if len(Xs) != self.size:
            raise GroupError(f"{len(Xs)} data sets for {self.size} RBMs")
        first = self.members[0]
        sizes = [int(X.shape[0]) for X in Xs]
        batch = min(first.batch_size, min(sizes))
        if any(min(first.batch_size, n) != batch or n // batch != sizes[0] // batch for n in sizes):
            raise GroupError(f"the members' data ({sizes} rows) make minibatches of different sizes or numbers "
                             f"at batch size {first.batch_size}")
        batches = range(sizes[0] // batch) if batches is None else batches
        momentum = first.momentum if epoch < first.momentum_epoch else first.final_momentum
        buf = self._buffers_for(batch)
        V = buf["V"]
        feeds = [minibatches(X, rbm.epoch_order(int(X.shape[0]), epoch), batch, batches, V[g, :batch], rbm.backend)
                 for g, (X, rbm) in enumerate(zip(Xs, self.members))]
        errors = [self.backend.zeros(()) for _ in self.members]  # each summed as its RBM sums it (on the device)
        xp = self.backend.xp
        for _ in zip(*feeds):  # each member's minibatch now in its slice of V
            for error, step_error in zip(errors, self._cd_step(batch, momentum)):
                xp.add(error, step_error, out=error)
        n_seen = len(batches) * batch
        stats = [EpochStats(epoch, n_seen, float(e) / max(n_seen, 1)) for e in errors]
        for rbm, stat in zip(self.members, stats):
            rbm.history_.append(stat)
        return stats

    def _buffers_for(self, batch: int) -> dict:
        if batch not in self._buffers:
            be = self.backend
            g, nv, nh = self.weights.shape
            self._buffers[batch] = {"V": be.empty((g, 2 * batch, nv)), "H": be.empty((g, 2 * batch, nh)),
                                    "h_sample": be.empty((g, batch, nh)), "diff": be.empty((g, batch, nv)),
                                    "grad": be.empty((g, nv, nh))}
        return self._buffers[batch]

    def _sigmoid(self, x, bias) -> None:
        for g in range(self.size):  # the fused kernel is two-dimensional: a member's slice at a time
            self.backend.sigmoid(x[g], out=x[g], bias=bias[g])

    def _visible(self, h, out):
        self.backend.matmul(h, self.weights.transpose(0, 2, 1), out=out)
        if self.members[0].visible == "bernoulli":
            self._sigmoid(out, self.visible_bias)
        else:
            out += self.visible_bias[:, None, :]
        return out

    def _hidden(self, v, out):
        self.backend.matmul(v, self.weights, out=out)
        self._sigmoid(out, self.hidden_bias)
        return out

    def _sample(self, p, out):
        for g, rbm in enumerate(self.members):  # each member's draws from its own stream
            rbm.backend.uniform(out[g])
        return self.backend.xp.less(out, p, out=out)

    def _cd_step(self, B: int, momentum: float) -> list:
        """One CD-k update of every member on its minibatch (the first half of its slice of ``V``),
        as :meth:`RBM._cd_step`; returns the members' summed squared reconstruction errors."""
        be, xp = self.backend, self.backend.xp
        first = self.members[0]
        buf = self._buffers_for(B)
        V, H = buf["V"], buf["H"]
        v0, vk, h0, hk = V[:, :B], V[:, B:], H[:, :B], H[:, B:]

        self._hidden(v0, out=h0)
        h = h0
        for _ in range(first.cd_k):
            h = self._sample(h, buf["h_sample"])
            self._visible(h, out=vk)
            h = self._hidden(vk, out=hk)
        diff = xp.subtract(v0, vk, out=buf["diff"])
        errors = [xp.vdot(diff[g].ravel(), diff[g].ravel()) for g in range(self.size)]

        scale = first.learning_rate / B
        h0 *= scale
        hk *= -scale
        grad = be.matmul(V.transpose(0, 2, 1), H, out=buf["grad"])
        for g in range(self.size):  # sums over a member's rows, as its own step sums them
            grad_hidden = H[g].sum(axis=0)
            grad_visible = scale * (v0[g].sum(axis=0) - vk[g].sum(axis=0))
            be.momentum_step(self.visible_bias[g], self.visible_bias_inc[g], grad_visible, momentum)
            be.momentum_step(self.hidden_bias[g], self.hidden_bias_inc[g], grad_hidden, momentum)
        be.momentum_step(self.weights, self.weights_inc, grad, momentum, first.learning_rate * first.weight_cost)
        return errors
