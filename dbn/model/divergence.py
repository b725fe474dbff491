"""Stop training that has gone to NaN or infinity, at the epoch it shows, and say what to change.

Contrastive divergence and backprop diverge when the learning rate is too high for the data:
the reconstruction error or the loss becomes NaN, and every later epoch trains on NaN. One
process checks each epoch's figure (:func:`check_epoch`); a distributed job checks the
parameters each superstep trained (:func:`check_arrays`, on the master), since a worker sees
only its own shards. Both raise :class:`~dbn.errors.TrainingDiverged` with one message.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import TrainingDiverged

#: Hinton's practical guide (section 13.2): Gaussian visible units need a learning rate one
#: or two orders of magnitude below a Bernoulli layer's.
GAUSSIAN_HINT = ("Gaussian visible units need a rate one or two orders of magnitude below a Bernoulli layer's "
                 "(Hinton's practical guide, 13.2), e.g. pretrain_learning_rate = [0.001, 0.1, ...]")


def diverged(phase: str, epoch: int, what: str, *, layer: int | None = None, rate=None,
             gaussian: bool = False) -> TrainingDiverged:
    """The error for ``phase`` ("pretrain" or "finetune") gone non-finite in ``epoch`` (from 0)."""
    if phase == "pretrain":
        hint = f"lower [model] pretrain_learning_rate for layer {layer + 1}" + (f" ({rate} now)" if rate else "")
        if gaussian:
            hint += f"; {GAUSSIAN_HINT}"
        return TrainingDiverged(f"pre-training diverged: layer {layer + 1}'s {what} in epoch {epoch + 1}: {hint}")
    hint = "lower [model] finetune_learning_rate" + (f" ({rate} now)" if rate else "")
    return TrainingDiverged(f"fine-tuning diverged: {what} in epoch {epoch + 1}: {hint}")


def check_epoch(value: float, name: str, phase: str, epoch: int, **context) -> None:
    """Raise :func:`diverged` when an epoch's ``value`` (its reconstruction error or loss) is not finite."""
    if not math.isfinite(value):
        raise diverged(phase, epoch, f"{name} became {value}", **context)


def check_arrays(arrays: dict, phase: str, epoch: int, **context) -> None:
    """Raise :func:`diverged` when an array of ``arrays`` (name -> array) holds NaN or infinity."""
    for name, array in arrays.items():
        # One summing pass, in float64 so that no finite float32 values overflow: NaN and
        # infinities carry through a sum.
        if np.asarray(array).dtype.kind == "f" and not math.isfinite(float(np.sum(array, dtype=np.float64))):
            raise diverged(phase, epoch, f"{name} holds NaN or infinity", **context)
