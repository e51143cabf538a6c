"""FlatParams: a model whose parameters and gradient are each one flat vector."""
from __future__ import annotations

import numpy as np


class FlatParams:
    """The ``params`` and ``grad`` vectors of a model with ``n_params``, ``dtype``, ``_params``
    and ``_grad``; subclasses bind their layers in :meth:`use_grad_buffer`."""

    @property
    def params(self) -> np.ndarray:
        return self._params

    @params.setter
    def params(self, value) -> None:
        value = np.asarray(value)
        if value.shape != self._params.shape:
            raise ValueError(f"params must have shape {self._params.shape}, got {value.shape}")
        np.copyto(self._params, value)

    @property
    def grad(self) -> np.ndarray:
        return self._grad

    def _grad_buffer(self, buf: np.ndarray | None) -> np.ndarray:
        """``buf`` checked to be a contiguous (n_params,) vector of the model's dtype, or a fresh
        zeroed one when None."""
        if buf is None:
            return np.zeros(self.n_params, self.dtype)
        if not (isinstance(buf, np.ndarray) and buf.shape == (self.n_params,)
                and buf.dtype == self.dtype and buf.flags.c_contiguous):
            raise ValueError(f"a gradient buffer must be a contiguous {self.dtype} vector of "
                             f"length {self.n_params}, got {getattr(buf, 'dtype', type(buf))} "
                             f"{getattr(buf, 'shape', '')}")
        return buf
