"""Per-feature statistics gathered block by block and merged across workers (:class:`FeatureStats`),
and the feature scaler they make (:class:`Scaler`), which a model keeps to scale new rows as its
training rows were."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from iterreduce.exceptions import TableError
from iterreduce.specification import Specification

#: The names of :meth:`FeatureStats.arrays`.
FIELDS = ("count", "min", "max", "sum", "sum_sq")


@dataclass(eq=False)
class FeatureStats:
    """Per-feature count, min, max, sum and sum of squares (float64), gathered a block of rows
    at a time (:meth:`update`) and mergeable (:meth:`merge`): per-worker partials add up to
    the statistics of the whole table."""

    count: int
    min: np.ndarray
    max: np.ndarray
    sum: np.ndarray
    sum_sq: np.ndarray

    @classmethod
    def empty(cls, n_features: int) -> FeatureStats:
        """Statistics of no rows yet."""
        return cls(0, np.full(n_features, np.inf), np.full(n_features, -np.inf),
                   np.zeros(n_features), np.zeros(n_features))

    @classmethod
    def of(cls, X: np.ndarray) -> FeatureStats:
        """The statistics of the rows of ``X``."""
        return cls.empty(np.shape(X)[1]).update(X)

    @property
    def n_features(self) -> int:
        return len(self.sum)

    def update(self, block: np.ndarray) -> FeatureStats:
        """Add the rows of ``block`` (rows x features); returns self."""
        block = np.asarray(block, dtype=np.float64)
        if block.ndim != 2 or block.shape[1] != self.n_features:
            raise TableError(f"feature statistics: a block of shape {block.shape}, expected rows x {self.n_features}")
        if len(block):
            self.count += len(block)
            np.minimum(self.min, block.min(axis=0), out=self.min)
            np.maximum(self.max, block.max(axis=0), out=self.max)
            self.sum += block.sum(axis=0)
            self.sum_sq += np.einsum("ij,ij->j", block, block)
        return self

    def merge(self, other: FeatureStats) -> FeatureStats:
        """The statistics of the rows of both (new; neither is changed)."""
        if other.n_features != self.n_features:
            raise TableError(f"feature statistics: cannot merge {other.n_features} features into {self.n_features}")
        return FeatureStats(self.count + other.count, np.minimum(self.min, other.min), np.maximum(self.max, other.max),
                            self.sum + other.sum, self.sum_sq + other.sum_sq)

    @property
    def mean(self) -> np.ndarray:
        return self.sum / self._rows()

    @property
    def std(self) -> np.ndarray:
        """The population standard deviation. From sums of squares: for features whose mean is
        far larger than their spread (e.g. 1e8 +- 1), rounding swamps it."""
        return np.sqrt(np.maximum(self.sum_sq / self._rows() - self.mean ** 2, 0.0))

    def _rows(self) -> int:
        if self.count == 0:
            raise TableError("feature statistics of no rows")
        return self.count

    def min_max_scaler(self) -> Scaler:
        """Maps each feature's [min, max] to [0, 1]; a constant feature to 0."""
        self._rows()
        span = self.max - self.min
        return Scaler("min_max", self.min.copy(), np.divide(1.0, span, out=np.zeros_like(span), where=span > 0))

    def standardizer(self) -> Scaler:
        """Maps each feature to mean 0, standard deviation 1; a constant feature to 0."""
        std = self.std
        return Scaler("standard", self.mean, np.divide(1.0, std, out=np.zeros_like(std), where=std > 0))

    def arrays(self) -> dict[str, np.ndarray]:
        """The statistics as float64 arrays of one length (:data:`FIELDS`; the count repeated per
        feature), e.g. to be reduced element by element as a job's parameters."""
        return {"count": np.full(self.n_features, float(self.count)), "min": self.min, "max": self.max,
                "sum": self.sum, "sum_sq": self.sum_sq}

    @classmethod
    def from_arrays(cls, arrays: dict) -> FeatureStats:
        """The statistics :meth:`arrays` gave."""
        return cls(int(arrays["count"][0]), arrays["min"], arrays["max"], arrays["sum"], arrays["sum_sq"])

    def scaler(self, kind: str) -> Scaler:
        """The scaler of ``kind``: "min_max" (:meth:`min_max_scaler`) or "standard" (:meth:`standardizer`)."""
        return self.min_max_scaler() if kind == "min_max" else self.standardizer()


@dataclass(eq=False)
class Scaler(Specification):
    """``x -> (x - offset) * scale`` per feature, in float32: saved with a model
    (:meth:`to_dict`) so new data is scaled as the training data was."""

    kind: str            # "min_max" or "standard": what made it
    offset: np.ndarray
    scale: np.ndarray

    def transform(self, X: np.ndarray) -> np.ndarray:
        """``X`` (rows x features) scaled, as float32. Computed in float64 and rounded once, so a
        min-max scaler maps its training data into [0, 1] exactly (in float32 the maximum could
        land one step above 1); it clips new data beyond the training range to [0, 1], the
        range Bernoulli units take."""
        X = np.asarray(X)
        if X.ndim != 2 or X.shape[1] != len(self.offset):
            raise TableError(f"{self.kind} scaler: data of shape {X.shape}, expected rows x {len(self.offset)}")
        scaled = (X.astype(np.float64) - self.offset) * self.scale
        if self.kind == "min_max":
            np.clip(scaled, 0.0, 1.0, out=scaled)
        return scaled.astype(np.float32)

    @classmethod
    def from_dict(cls, d: dict) -> Scaler:
        """The scaler :meth:`to_dict` wrote."""
        return cls(d["kind"], np.asarray(d["offset"], np.float64), np.asarray(d["scale"], np.float64))



def merged(parts: list[FeatureStats]) -> FeatureStats:
    """The statistics of the rows of all ``parts``, merged in their order (the same bits every time)."""
    return functools.reduce(FeatureStats.merge, parts)
