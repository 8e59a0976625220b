"""What a .npy stream's header declares, read before its data: numpy allocates whatever a header says, so
untrusted files (pipeline weights, an output's kept rows) are judged by it first."""

from __future__ import annotations

from typing import IO

import numpy as np

__all__ = ["read_npy_header"]


def read_npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype the .npy header at ``f``'s position declares; ``f`` is left at the data. Raises
    ValueError for a stream that is no .npy (format 3.0 differs from 2.0 only in allowing UTF-8 in field
    names, read alike)."""
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
    return tuple(shape), dtype
