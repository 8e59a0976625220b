"""Which writer an output path names: a zarr store (a directory) or a Parquet file; anything else is refused.

Light on purpose (no torch): the CLI checks an output before it imports the engine, so a mistyped
``-o feats.csv`` is refused at once rather than after the start-up of a run.
"""

from __future__ import annotations

import os
from pathlib import Path

from tsconv.errors import TsconvError
from tsconv.io.objstore import StoreURL, location
from tsconv.io.writers.parquet_writer import is_parquet_path

__all__ = ["ZARR_SUFFIXES", "output_format"]

ZARR_SUFFIXES = ("", ".zarr", ".zr3")


def output_format(output: str | os.PathLike[str] | StoreURL) -> str:
    """The format ``output`` names, "parquet" or "zarr"; a TsconvError naming both for any other suffix."""
    loc = location(output)
    if is_parquet_path(loc):
        return "parquet"
    if Path(loc.name).suffix.lower() in ZARR_SUFFIXES:
        return "zarr"
    raise TsconvError(
        f"output {str(output)!r} names no format tsconv writes",
        hint="write a zarr store (a directory, e.g. feats.zarr) or a Parquet file (.parquet or .pq).",
    )
