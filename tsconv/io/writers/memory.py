"""In-memory sinks: the rows of a run into a preallocated array, row-major or feature-major."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tsconv.io import hostmem
from tsconv.io.contracts import is_rows_of
from tsconv.io.transpose import transpose_into

__all__ = ["ArraySink"]


class ArraySink:
    """Rows appended in order into ``out``: [T, D] float32, or [D, T] with ``feature_major`` (polars' and
    Arrow's layout, each column then a contiguous view), written by a blocked transpose."""

    threads = 0
    busy_seconds = 0.0

    def __init__(
        self, rows: int, outputs: int, *, feature_major: bool = False, into: np.ndarray | None = None
    ) -> None:
        """``into``: the caller's [rows, outputs] float32 C-contiguous array to fill (row-major only)."""
        shape = (outputs, rows) if feature_major else (rows, outputs)
        if into is not None:
            assert not feature_major and into.shape == shape and into.dtype == np.float32
        self.out = hostmem.empty(shape, np.float32) if into is None else into
        self.feature_major = feature_major
        self.pos = 0

    def reserve(self, n: int) -> np.ndarray | None:
        """The next ``n`` rows of ``out`` as [n, D] (for feature-major ``out``, a view with a column's stride),
        for an engine to compute into."""
        return (
            self.out[:, self.pos : self.pos + n].T
            if self.feature_major
            else self.out[self.pos : self.pos + n]
        )

    def append(self, block: np.ndarray, *, release: Callable[[], None] | None = None) -> None:
        try:
            n = block.shape[0]
            if self.feature_major:
                if not is_rows_of(block, self.out.T, self.pos):  # rows computed in place need no copy
                    transpose_into(self.out[:, self.pos : self.pos + n], block)
            elif not is_rows_of(block, self.out, self.pos):
                self.out[self.pos : self.pos + n] = block
            self.pos += n
        finally:
            if release is not None:
                release()

    def finish(self) -> None:
        rows = self.out.shape[1] if self.feature_major else self.out.shape[0]
        if self.pos != rows:
            msg = f"internal error: {self.pos} of {rows} rows computed"
            raise RuntimeError(msg)

    def close(self) -> None:
        pass
