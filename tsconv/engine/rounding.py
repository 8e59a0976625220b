"""What reading the input as float32 loses, said where it matters.

On the CPU a float64 input is read as it is (``Backend.reads_float64``); the GPU's engine reads float32
(the filters then compute in float64, stages of weights in float32), and there, as everywhere for integers
beyond 2^24, the input is rounded on read: near 400 a float64 price moves by up to
1.5e-5, which is 1.5e-3 of a 0.01 step, and every difference or deviation of such prices carries it. The
first rows a run reads are checked once; where rounding moves a feature's values by more than
:data:`WARN_AT` of its typical one-step change, a :class:`~tsconv.errors.TsconvWarning` names it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from tsconv.errors import TsconvWarning
from tsconv.io.contracts import exact_in_float32

__all__ = ["WARN_AT", "Float32Check", "float32_loss"]

# The FP16-storage warning's threshold (README, "Precision"): half the 1e-3 of an output's scale promised.
WARN_AT = 5e-4
_SAMPLE_ROWS = 1024


def float32_loss(sample: np.ndarray, names: Sequence[str]) -> str | None:
    """A warning's text where rounding ``sample`` [n, F] (the input's rows in its own dtype) to float32 moves
    a feature's values by more than :data:`WARN_AT` of its typical step (the mean of its nonzero one-step
    changes), or past float32's range; None where it does not."""
    if exact_in_float32(sample.dtype) or sample.size == 0:
        return None
    x = np.asarray(sample[:_SAMPLE_ROWS], dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = x.astype(np.float32).astype(np.float64)
    finite = np.isfinite(x)
    if (finite & ~np.isfinite(rounded)).any():
        j = int(np.flatnonzero((finite & ~np.isfinite(rounded)).any(axis=0))[0])
        return (
            f"the input's values are {sample.dtype} and {names[j]!r} holds values beyond float32's range "
            f"(about 3.4e38), which tsconv reads as infinities; rescale them, or store them as float32"
        )
    moved = np.where(finite, np.abs(x - rounded), 0.0).max(axis=0)
    with np.errstate(invalid="ignore"):
        steps = np.abs(np.diff(x, axis=0))
    # the mean of the nonzero finite steps, one pass (a median took 0.2-0.6 s on 4,096 x 1,024 on the VM)
    used = np.isfinite(steps) & (steps > 0)
    count = used.sum(axis=0)
    if not count.any():
        return None
    typical = np.where(used, steps, 0.0).sum(axis=0) / np.maximum(count, 1)
    share = np.where(count > 0, moved / np.where(count > 0, typical, 1.0), 0.0)
    over = np.flatnonzero(share > WARN_AT)
    if not over.size:
        return None
    j = int(over[np.argmax(share[over])])
    others = f" (and {over.size - 1:,} more features)" if over.size > 1 else ""
    return (
        f"the input's values are {sample.dtype}, and tsconv computes from float32: rounding the values of "
        f"{names[j]!r} to float32 moves them by up to {moved[j]:.2g}, {share[j]:.1e} of their mean nonzero "
        f"one-step change ({typical[j]:.2g}){others}, and differences and deviations of them carry that error. For results "
        f"exact to the input, store float32 values near zero (prices less a reference level) or prices in ticks "
        f"as integers below 2^24"
    )


class Float32Check:
    """Checks the first rows a run reads in a dtype float32 does not hold exactly (:func:`float32_loss`), once,
    and warns from the caller's thread."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self.done = False

    def see(self, rows: np.ndarray) -> None:
        """Check ``rows`` [n, F] (as read, one column per name) unless rows were checked already."""
        if self.done or rows.shape[0] == 0 or exact_in_float32(rows.dtype):
            return
        self.done = True
        if (message := float32_loss(rows, self.names)) is not None:
            warnings.warn(message, TsconvWarning, stacklevel=3)
