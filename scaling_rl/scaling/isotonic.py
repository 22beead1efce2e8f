"""Isotonic (non-decreasing) regression of learning curves — the one helper that `data` (aligning seeds)
and `curves` (D_J) both use, in its own module so neither imports the other."""
from __future__ import annotations

import numpy as np
from sklearn.isotonic import isotonic_regression

try:  # sklearn's PAVA kernel without per-call validation (~50x less overhead on short curves)
    from sklearn._isotonic import _inplace_contiguous_isotonic_regression as _pava
except ImportError:  # pragma: no cover - private API moved
    _pava = None


def isotonic_rows(Y: np.ndarray) -> np.ndarray:
    """Non-decreasing least-squares fit of each row of Y (K, T) (scikit-learn's PAVA)."""
    Y = np.array(Y, dtype=np.float64, order="C", ndmin=2, copy=True)
    if Y.shape[1] < 2:
        return Y
    mono = np.all(np.diff(Y, axis=1) >= 0, axis=1)
    w = np.ones(Y.shape[1])
    for k in np.flatnonzero(~mono):
        if _pava is not None:
            row = np.ascontiguousarray(Y[k])
            _pava(row, w.copy())
            Y[k] = row
        else:
            Y[k] = isotonic_regression(Y[k])
    return Y
