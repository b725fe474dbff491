"""Hyperparameters declared once, in ``__init__``: scikit-learn's estimator convention."""

from __future__ import annotations

import inspect

from .backend import Backend


class Estimator:
    """Base of :class:`~dbn.model.rbm.RBM` and :class:`~dbn.model.estimator.DBN`.

    The signature of ``__init__`` is the one list of hyperparameters. ``__init__``
    stores every argument as given and checks nothing; :meth:`get_params` and
    :meth:`set_params` take the names from the signature, so ``type(m)(**m.get_params())``
    is a clone with the very same values (what scikit-learn's ``clone`` expects);
    the subclass's ``validate_params`` checks the values when training starts.
    The device :attr:`backend` is made on first use from ``device``, ``dtype`` and ``seed``.
    """

    _backend: Backend | None = None

    @classmethod
    def _param_names(cls) -> list[str]:
        """The hyperparameters: the arguments of ``__init__``, in order."""
        parameters = inspect.signature(cls.__init__).parameters.values()
        return [p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def _store_params(self, arguments: dict) -> None:
        """Store every hyperparameter as given: ``__init__`` passes its ``locals()``."""
        for name in self._param_names():
            setattr(self, name, arguments[name])

    def get_params(self, deep: bool = True) -> dict:
        """The hyperparameters by name, as given (``deep`` is for scikit-learn: there are no nested estimators)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params) -> "Estimator":
        """Set hyperparameters by name; returns the estimator. A new ``device``, ``dtype`` or
        ``seed`` makes a fresh backend on next use."""
        names = self._param_names()
        for name, value in params.items():
            if name not in names:
                raise ValueError(f"invalid parameter {name!r} for {type(self).__name__}: expected one of {names}")
            setattr(self, name, value)
        if params.keys() & {"device", "dtype", "seed"}:
            self._backend = None
        return self

    def learned(self, name: str):
        """The learned attribute ``name`` (its name ends in ``_``), or None where this estimator
        has not learned it: before ``fit``, or a model trained without it (a scaler, classes, columns)."""
        return getattr(self, name, None)

    @property
    def backend(self) -> Backend:
        """The array module, dtype and random stream on this estimator's device."""
        if self._backend is None:
            self._backend = Backend(self.device, self.dtype, self.seed)
        return self._backend
