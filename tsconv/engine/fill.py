"""Causal forward fill of missing values, carried across chunk boundaries.

A NaN takes the last non-NaN value of its feature; NaNs before a feature's first value stay NaN.
The whole state between chunks is the last filled row.
"""

from __future__ import annotations

import numpy as np
import torch

from tsconv.io.contracts import BandReader

__all__ = ["forward_fill", "forward_fill_torch", "fill_state_before"]


def forward_fill(block: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fill ``block`` [n, F] (float) given ``last`` [F], the filled row before it. Returns (filled, new last)."""
    mask = np.isnan(block)
    if not mask.any():
        return block, block[-1].copy()
    n = block.shape[0]
    # Index of the last valid row at or before each row; -1 means "take the carried state".
    idx = np.where(mask, -1, np.arange(n)[:, None])
    np.maximum.accumulate(idx, axis=0, out=idx)
    ext = np.concatenate([last[None, :].astype(block.dtype, copy=False), block], axis=0)
    filled = np.take_along_axis(ext, idx + 1, axis=0)
    return filled, filled[-1].copy()


def forward_fill_torch(block: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """:func:`forward_fill` on a device tensor ``block`` [n, F] given ``last`` [F]: the filled rows (the same
    values; the new state is their last row). Free of data-dependent branches, so torch.compile traces it."""
    n = block.shape[0]
    steps = torch.arange(n, device=block.device)[:, None]
    idx = torch.where(torch.isnan(block), -1, steps).cummax(dim=0).values  # last valid row, -1: the state
    ext = torch.cat([last[None, :].to(block.dtype), block], dim=0)
    return ext.gather(0, idx + 1)


def fill_state_before(source: BandReader, row: int, dtype: np.dtype) -> np.ndarray:
    """The forward-fill state at ``row``: per feature, the last non-NaN value in rows < ``row``.

    Walks back one band at a time and stops once every feature has a value, so a resume after a
    kill reads only what it needs (everything back to row 0 only for features that are NaN so far).
    """
    state = np.full(source.n_features, np.nan, dtype=dtype)
    missing = np.ones(source.n_features, dtype=bool)
    stop = row
    while stop > 0 and missing.any():
        start = max(0, (stop - 1) // source.band_rows * source.band_rows)
        block = np.asarray(source.read(start, stop), dtype=dtype)
        valid = ~np.isnan(block[:, missing])
        has = valid.any(axis=0)
        if has.any():
            last_idx = block.shape[0] - 1 - np.argmax(valid[::-1], axis=0)
            cols = np.flatnonzero(missing)[has]
            state[cols] = block[last_idx[has], cols]
            missing[cols] = False
        stop = start
    return state
