"""A run's warning where reading its input as float32 loses what matters (:mod:`tsconv.io.precision`).

The GPU's engine, and a stream whose first push was float32, read float32; the CPU's engine reads an input
float32 does not hold as float64 and has nothing to say.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from tsconv.errors import TsconvWarning
from tsconv.io.precision import exact_in_float32, float32_loss_by_feature

__all__ = ["Float32Check"]

# Reads a check looks at before it stops waiting for the features with no step yet (symbols not trading)
_MAX_CHECKS = 64
_SAMPLE_ROWS = 1024  # rows judged a read, from its first with a value


class Float32Check:
    """Checks the rows a run reads in a dtype float32 does not hold, and warns once, from the caller's thread,
    where rounding them to float32 matters (:func:`tsconv.io.precision.float32_loss`). A feature is judged on
    the first read in which it moves (a symbol that starts late, on a later one); the check stops at the
    warning, once every feature is judged, or after :data:`_MAX_CHECKS` reads."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.pending = np.ones(len(self.names), dtype=bool)
        self.checks = 0

    @property
    def done(self) -> bool:
        return not self.pending.any() or self.checks >= _MAX_CHECKS

    def see(self, rows: np.ndarray, columns: Sequence[int] | None = None) -> None:
        """Check ``rows`` [n, F] (as read: one column per name, or ``columns`` of them, in the names' order)
        for the features not judged yet; nothing is copied once every feature is judged or for a dtype
        float32 holds."""
        if self.done or rows.shape[0] == 0 or exact_in_float32(rows.dtype):
            return
        self.checks += 1
        cols = np.flatnonzero(self.pending)
        sel = cols if columns is None else np.asarray(columns)[cols]
        # from the first row where one of them has a value (a late symbol's first rows in this read), a block
        # at a time: a read can be a band of 65,536 rows of a wide store, too much to copy for a sample
        first = rows.shape[0]
        for a in range(0, rows.shape[0], _SAMPLE_ROWS):
            finite = np.isfinite(rows[a : a + _SAMPLE_ROWS, sel]).any(axis=1)
            if finite.any():
                first = a + int(np.argmax(finite))
                break
        part = rows[first : first + _SAMPLE_ROWS, sel]
        message, settled = float32_loss_by_feature(part, [self.names[j] for j in cols])
        self.pending[cols[settled]] = False
        if message is not None:
            self.pending[:] = False
            warnings.warn(message, TsconvWarning, stacklevel=3)
