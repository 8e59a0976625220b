"""A row-major block into a feature-major buffer (polars', Arrow's and Parquet's column layout)."""

from __future__ import annotations

import numpy as np

__all__ = ["transpose_into"]


def transpose_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src.T`` for a row-major block ``src`` [n, F], in cache-sized row blocks.

    A plain ``dst[:] = src.T`` walks one of the two with a large stride and runs at about 0.5 GB/s;
    blocks of ~256 KB of ``src`` run at 1.5-3.5 GB/s (measured for F = 8..1024 on the dev machine).
    """
    step = max(16, (256 << 10) // max(1, src.shape[1] * src.itemsize))
    for s in range(0, src.shape[0], step):
        dst[:, s : s + step] = src[s : s + step].T
