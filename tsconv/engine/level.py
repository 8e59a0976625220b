"""The level of each chunk (CPU engine) or step (batched engine) that a first stage's re-centring falls back on.

A first stage of weights on level data computes each block of outputs as conv(x - v) + v * sum(taps), with v
the block's own level (the median of a few rows at its start; see ``conv1d(recenter=)``), so that raw price
levels keep their low digits. Where a block has no finite sample of a feature (a symbol that starts trading
inside it) or a sample before the call's first row, v is this chunk level c instead
(``conv1d(recenter_fallback=)``), so c must be close to the chunk's values; it must also come from a step no
later than the outputs it touches, so that causality holds bit for bit. Log levels (``[preprocess] transform
= "log"``) are centred on the log of it in float64 before their rounding to float32.

The rule, per feature: the median of the finite values among the last TAIL_ROWS prepared rows before the
chunk (the lower middle one when their count is even; the engines read that many rows before a chunk or
step whatever the halo, :func:`rows_before`), so that up to two infinities or bad prints in a row at a chunk edge are never the level (an infinite level made every output of the next chunk NaN; a
level of 1e30 left every output of it off by about 1e23); else the fill state where it is finite; else
the feature's first finite value in the chunk (the outputs before it read no finite value of the
feature, so the choice cannot change them); else 0. Rows before step 0 (the zero history) are not data
and never count. Two cases can still give a chunk a level far from its values: a burst of three or more
extreme values ending exactly at a chunk edge, and a feature whose first finite print is extreme (its
first finite value is the only causal choice). The outputs then keep their non-finite pattern, but the
blocks of that chunk that fall back on the level lose precision in proportion to the extreme value.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "TAIL_ROWS",
    "level_before",
    "level_before_torch",
    "centering_level",
    "centering_level_torch",
    "rows_before",
]

TAIL_ROWS = 5


def rows_before(halo: int) -> int:
    """Input rows before its first step that a run reads and carries from chunk to chunk: the halo, and at
    least the TAIL_ROWS a chunk's level takes (a stage of one or two taps has a halo of 0 or 1 row, and one bad print
    there would be that chunk's level)."""
    return max(halo, TAIL_ROWS)


def level_before(tail: np.ndarray, state: np.ndarray) -> np.ndarray:
    """The level known before a chunk: [F] float32, NaN where no finite value is known yet.

    ``tail`` [m, F] (m <= TAIL_ROWS) holds the last prepared rows before the chunk, ``state`` [F] the
    fill state (the last non-NaN value of each feature).
    """
    level = np.where(np.isfinite(state), state, np.nan).astype(np.float32)
    if tail.shape[0] == 0:
        return level
    t = np.where(np.isfinite(tail), tail, np.nan)
    count = np.isfinite(t).sum(axis=0)
    ordered = np.sort(t, axis=0)  # NaN sorts last
    mid = np.take_along_axis(ordered, (np.maximum(count - 1, 0) // 2)[None, :], axis=0)[0]
    return np.where(count > 0, mid, level).astype(np.float32)


def centering_level(before: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``before`` (from :func:`level_before`) completed from the chunk's prepared ``rows`` [n, F]: a
    feature without a level takes its first finite value in the chunk, else 0."""
    level = before.copy()
    late = np.flatnonzero(np.isnan(level))
    if late.size:
        finite = np.isfinite(rows[:, late])
        has = finite.any(axis=0)
        level[late[has]] = rows[np.argmax(finite[:, has], axis=0), late[has]]
        level[late[~has]] = 0.0
    return level


def centering_level_torch(before: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """:func:`centering_level` on device tensors, without data-dependent branches (torch.compile traces it)."""
    finite = torch.isfinite(rows)
    first = rows.gather(0, torch.argmax(finite.to(torch.int8), dim=0)[None, :])[0]  # the first finite row
    late = torch.where(finite.any(dim=0), first, 0.0).to(before.dtype)
    return torch.where(torch.isnan(before), late, before)


def level_before_torch(tail: torch.Tensor, state: torch.Tensor, out: torch.Tensor) -> None:
    """:func:`level_before` on device tensors, into ``out`` (the batched engine's level buffer; the
    prepare kernel completes it from the step's rows)."""
    known = torch.where(torch.isfinite(state), state, torch.nan)
    if tail.shape[0] == 0:
        out.copy_(known)
        return
    t = torch.where(torch.isfinite(tail), tail, torch.nan)
    count = torch.isfinite(t).sum(dim=0)
    ordered = torch.sort(t, dim=0).values  # NaN sorts last
    mid = ordered.gather(0, (torch.clamp(count - 1, min=0) // 2)[None, :])[0]
    out.copy_(torch.where(count > 0, mid, known))
