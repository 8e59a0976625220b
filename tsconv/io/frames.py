"""Polars / Arrow / numpy access to stores, and the research API's frame support.

- :func:`open_store` returns a :class:`StoreInfo` (rows, features, dtype, chunks, time span).
- :func:`iter_chunks` yields the store in row chunks as polars DataFrames, Arrow record batches or
  :class:`ArrayChunk` (numpy), optionally each with ``halo`` rows of history before it.
- In-memory frames as a run's input and result (:func:`tsconv.features`): :mod:`tsconv.io.dataframes`.

What is and is not zero-copy (the store is row-major [T, F], the one unavoidable step is decoding
the store's chunks):

- ``as_="numpy"``: ``values`` is a view of the decoded store chunk when the requested rows (halo
  included) lie within one store chunk, else one concatenation copy. ``time`` likewise.
- ``as_="arrow"`` and ``as_="polars"``: Arrow and polars hold each column contiguously, so a
  row-major block must be transposed: exactly one copy of the values, written straight from the
  decoded store chunks into a feature-major [F, n] buffer (no intermediate concatenation). Every
  column is then a zero-copy view of one row of that buffer (``pa.array`` of a contiguous 1-D numpy
  array, and ``pl.from_arrow`` of that, share memory). The time column (int64 ns viewed as
  ``timestamp[ns, UTC]``) is zero-copy from the decoded time chunk when it lies in one chunk.
  ``pl.from_numpy(block)`` or ``pl.DataFrame({name: block[:, j]})`` would also copy (per column,
  strided), and be slower. float16 stores come out as float32 (polars has no float16).
- NaN cells stay NaN (not null) in every variant.

Measured (1,048,576 x 64 float32 store, 65536-row Blosc-lz4 chunks, rows=65536, 2 shared CPU cores):
decode alone 0.9-1.1 GB/s, numpy chunks 0.8-1.1 GB/s, polars/Arrow chunks 0.55 GB/s (the blocked
transpose); pl.from_numpy or a dict of strided columns instead: 0.26-0.29 GB/s.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tsconv.errors import ShapeError, StoreError, TsconvError
from tsconv.io.names import repeated_names
from tsconv.io.readers.blocks import BlockReader
from tsconv.io.store import InputStore, check_time, open_input
from tsconv.io.transpose import transpose_into

__all__ = [
    "ArrayChunk",
    "HALO_COLUMN",
    "StoreInfo",
    "iter_chunks",
    "open_store",
]

HALO_COLUMN = "is_halo"  # boolean column added to polars/arrow chunks when halo > 0
_FORMATS = ("polars", "arrow", "numpy")


@dataclass(frozen=True)
class StoreInfo:
    """An input store's metadata (opened read-only, validated by the store convention)."""

    path: Path
    rows: int
    features: tuple[str, ...]
    dtype: np.dtype
    chunks: tuple[int, int]
    has_time: bool
    time_start: np.datetime64 | None  # first and last timestamp (UTC), None without time
    time_end: np.datetime64 | None
    store: InputStore

    @property
    def n_features(self) -> int:
        return len(self.features)

    def iter_chunks(
        self,
        *,
        rows: int = 1024 * 64,
        halo: int = 0,
        columns: Sequence[str] | None = None,
        as_: str = "polars",
    ) -> Iterator[Any]:
        """See :func:`iter_chunks`."""
        return iter_chunks(self, rows=rows, halo=halo, columns=columns, as_=as_)

    def __repr__(self) -> str:
        span = f", time {self.time_start} .. {self.time_end}" if self.has_time else ", no time"
        return (
            f"StoreInfo({str(self.path)!r}, {self.rows:,} rows x {self.n_features} features, "
            f"{self.dtype}, chunks {list(self.chunks)}{span})"
        )


@dataclass(frozen=True)
class ArrayChunk:
    """One chunk as numpy: rows [start, stop) of the store, the first ``halo`` of them history."""

    start: int  # first row (halo included)
    stop: int
    halo: int  # leading rows that are history before the chunk proper
    values: np.ndarray  # [stop - start, len(names)], the store's dtype, read-only
    time: np.ndarray | None  # [stop - start] datetime64[ns] (UTC), None without time
    names: tuple[str, ...]


def open_store(path: str | os.PathLike[str] | InputStore | StoreInfo) -> StoreInfo:
    """Open a store read-only and return its metadata, its time checked as a run checks it (strictly
    increasing, none missing: a store's int64 time was passed through unchecked, NaT and backwards times
    included)."""
    if isinstance(path, StoreInfo):
        return path
    if not isinstance(path, str | os.PathLike | InputStore):
        raise TsconvError(f"expected a store's path or URL, got {type(path).__name__}")
    store = path if isinstance(path, InputStore) else open_input(path)
    t0 = t1 = None
    if store.time is not None:
        check_time(store)
        t0, t1 = (np.datetime64(int(store.time[i]), "ns") for i in (0, store.rows - 1))
    return StoreInfo(
        path=store.path,
        rows=store.rows,
        features=store.features,
        dtype=store.dtype,
        chunks=(int(store.values.chunks[0]), int(store.values.chunks[1])),
        has_time=store.time is not None,
        time_start=t0,
        time_end=t1,
        store=store,
    )


class _Columns:
    """A zarr array seen through a column selection; slicing rows reads only those columns' chunks."""

    def __init__(self, array: Any, cols: np.ndarray) -> None:
        self.array, self.cols = array, cols
        self.zarr_array = array  # the rows read_rows checks the chunk files of
        self.shape = (array.shape[0], cols.size)
        self.chunks, self.ndim, self.dtype = array.chunks, 2, array.dtype
        contiguous = cols.size and (np.diff(cols) == 1).all()
        self._slice = slice(int(cols[0]), int(cols[-1]) + 1) if contiguous else None

    def __getitem__(self, rows: slice) -> np.ndarray:
        if self._slice is not None:
            return np.asarray(self.array[rows, self._slice])
        return np.asarray(self.array.get_orthogonal_selection((rows, self.cols)))


def _select(store: InputStore, columns: Sequence[str] | None) -> tuple[tuple[str, ...], Any]:
    if columns is None:
        return store.features, store.values
    if isinstance(columns, str):
        columns = [columns]
    if isinstance(columns, set | frozenset):
        raise ShapeError("columns is a set, whose order is not defined", hint="pass a list of feature names.")
    try:
        columns = [str(c) if isinstance(c, np.str_) else c for c in columns]  # any iterable: a list, an array
    except TypeError:
        raise ShapeError(f"columns must be a list of feature names, got {type(columns).__name__}") from None
    index = {n: j for j, n in enumerate(store.features)}
    missing = [c for c in columns if c not in index]
    if missing:
        shown = ", ".join(repr(c) for c in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise StoreError(
            f"{store.path}: no feature named {shown}",
            hint=f"the store's features are {', '.join(store.features[:8])}"
            + (f", ... ({len(store.features)} in all)" if len(store.features) > 8 else ""),
        )
    if twice := repeated_names(columns):
        raise ShapeError(f"columns lists a feature twice: {', '.join(map(repr, twice[:5]))}")
    if not columns:
        raise ShapeError("columns is empty", hint="leave columns=None for all features.")
    cols = np.array([index[c] for c in columns], dtype=np.int64)
    if cols.size == store.n_features and (cols == np.arange(cols.size)).all():
        return store.features, store.values
    return tuple(columns), _Columns(store.values, cols)


def _pieces(reader: BlockReader, a: int, b: int) -> Iterator[tuple[int, np.ndarray]]:
    """Rows [a, b) as views of the decoded store chunks, split at chunk boundaries: (offset, view)."""
    band = reader.band_rows
    s = a
    while s < b:
        e = min(b, (s // band + 1) * band)
        yield s - a, reader.read(s, e)
        s = e


def iter_chunks(
    store: str | os.PathLike[str] | InputStore | StoreInfo,
    *,
    rows: int = 1024 * 64,
    halo: int = 0,
    columns: Sequence[str] | None = None,
    as_: str = "polars",
) -> Iterator[Any]:
    """Yield the store in chunks of ``rows`` rows (the last one shorter), in order.

    ``as_="polars"`` (default) yields ``pl.DataFrame``, ``"arrow"`` ``pa.RecordBatch``: first a column
    ``time`` (``Datetime("ns", "UTC")``) when the store has time, else ``step`` (int64 row index),
    then one column per feature (``columns`` selects and orders them; only their store chunks are
    decoded), in the store's dtype (float16 as float32). With ``halo > 0`` each chunk starts ``halo``
    rows earlier (clipped at row 0) and a boolean column ``is_halo`` marks those leading rows; record
    batches also carry ``tsconv.halo`` / ``tsconv.start`` in their schema metadata.
    ``as_="numpy"`` yields :class:`ArrayChunk` (``values`` a read-only view of the decoded store chunk
    where possible, which later chunks' halo rows may share: copy it to edit it). Store chunks are decoded
    once each where a chunk's halo spans at most a few of them (:class:`~tsconv.io.readers.blocks.BlockReader`
    keeps the last four decoded; a longer halo decodes its older store chunks again for each chunk).
    """
    if isinstance(rows, bool | np.bool_) or not isinstance(rows, int | np.integer) or rows < 1:
        raise TsconvError(f"rows must be a positive integer, got {rows!r}")
    if isinstance(halo, bool | np.bool_) or not isinstance(halo, int | np.integer) or halo < 0:
        raise TsconvError(f"halo must be a non-negative integer, got {halo!r}")
    rows, halo = int(rows), int(halo)
    if as_ not in _FORMATS:
        raise TsconvError(f"as_ must be one of {', '.join(_FORMATS)}, got {as_!r}")
    info = open_store(store)
    names, array = _select(info.store, columns)
    if as_ != "numpy":
        first = "time" if info.has_time else "step"
        clash = {first, HALO_COLUMN} & set(names) if halo else {first} & set(names)
        if clash:
            raise StoreError(
                f"{info.path}: a feature is named {sorted(clash)[0]!r}, which the chunk's own column uses",
                hint="select the other features with columns=[...] or use as_='numpy'.",
            )
    return _iter(info, names, array, rows, halo, as_)


def _iter(info: StoreInfo, names: tuple[str, ...], array: Any, rows: int, halo: int, as_: str) -> Iterator[Any]:  # fmt: skip
    where = str(info.path)
    values = BlockReader(array, where=where)
    times = BlockReader(info.store.time, where=where) if info.has_time else None
    # native byte order: Arrow holds no byte-swapped arrays (a big-endian zarr 2 store failed in pyarrow)
    out_dtype = np.dtype(np.float32) if info.dtype == np.float16 else info.dtype.newbyteorder("=")
    for s in range(0, info.rows, rows):
        e = min(s + rows, info.rows)
        a = max(0, s - halo)
        t = times.read(a, e).astype(np.int64, copy=False).view("datetime64[ns]") if times else None
        if as_ == "numpy":
            # read-only: a view shares the decoded band with the next chunk's halo rows, which an edit in
            # place would change
            v = _read_only(values.read(a, e))
            yield ArrayChunk(start=a, stop=e, halo=s - a, values=v, time=_read_only(t), names=names)
            continue
        cols = np.empty((len(names), e - a), dtype=out_dtype)  # the one copy: row-major -> columns
        for off, piece in _pieces(values, a, e):
            transpose_into(cols[:, off : off + piece.shape[0]], piece)
        yield _frame(names, cols, t, a, e, s - a, halo, as_)


def _read_only(a: np.ndarray | None) -> np.ndarray | None:
    if a is not None:
        a = a.view()
        a.flags.writeable = False
    return a


def _frame(names: tuple[str, ...], cols: np.ndarray, t: np.ndarray | None, a: int, e: int, lead: int, halo: int, as_: str) -> Any:  # fmt: skip
    import pyarrow as pa

    arrays, fields = [], []
    if t is not None:
        arrays.append(pa.array(t, type=pa.timestamp("ns", tz="UTC")))
        fields.append("time")
    else:
        arrays.append(pa.array(np.arange(a, e, dtype=np.int64)))
        fields.append("step")
    if halo:
        mask = np.zeros(e - a, dtype=bool)
        mask[:lead] = True
        arrays.append(pa.array(mask))
        fields.append(HALO_COLUMN)
    arrays.extend(pa.array(c) for c in cols)
    fields.extend(names)
    meta = {b"tsconv.start": str(a).encode(), b"tsconv.halo": str(lead).encode()}
    batch = pa.RecordBatch.from_arrays(arrays, names=fields, metadata=meta)
    if as_ == "arrow":
        return batch
    import polars as pl

    return pl.from_arrow(batch, rechunk=False)
