"""Input rows kept with an output, so that its next ``--update`` decodes none of the input's old bands.

An update computes again from the engine chunk holding the output's end and reads the pipeline's halo
before it: a few hundred or thousand input rows, which sit in the input's last old band. Decoding that
band (16 MB of zstd for a 2,000,000 x 32 store written by plain zarr: its chunks are 125,000 rows long)
made a 1% update on the 2-core VM take 0.090 s after start-up against 0.079 s without it (benchmarks/NOTES.md,
"Input rows kept with the output"). So a run on the CPU keeps those rows as stored, and the
fill state at their first row, in the output's ``values`` directory (``.tsconv-tail.npz``, beside the input
digest, which zarr and xarray do not read); the next update reads them from there where they are exactly
the rows it needs, and the input's digest check has passed (the rows before the output's end are unchanged).

The file holds plain arrays, read with ``allow_pickle=False``; anything unexpected in it (another output's
fingerprint, shape, dtype or end row, a damaged file, contents whose hash is not the one recorded beside the
input digest: :func:`tail_digest`) and the rows are read from the input as before. Outputs in object stores
keep none.
"""

from __future__ import annotations

import hashlib
import math
import os
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tsconv.io.contracts import BandReader
from tsconv.io.npyheader import read_npy_header
from tsconv.io.objstore import StoreURL

__all__ = [
    "TAIL_FILE",
    "InputTail",
    "TailedReader",
    "read_tail",
    "remove_tail",
    "tail_digest",
    "tail_rows_to_keep",
    "write_tail",
]

TAIL_FILE = ".tsconv-tail.npz"
# The most bytes kept: a wide input with a long halo (a dense pipeline over thousands of features) keeps
# none rather than write tens of MB at the end of every run.
MAX_TAIL_BYTES = 16 << 20


@dataclass(frozen=True)
class InputTail:
    """Input rows [start, start + len(rows)) as stored, all features, and the fill state at ``start`` (per
    pipeline input, float64; NaN where a feature has no value before it), for the output whose fingerprint
    (input, pipeline, chunk, warm-up) is ``fingerprint``."""

    start: int
    rows: np.ndarray
    state: np.ndarray
    fingerprint: str

    @property
    def stop(self) -> int:
        return self.start + int(self.rows.shape[0])


def tail_rows_to_keep(*, output_rows: int, chunk: int, halo: int) -> int:
    """Input rows before the output's end that its next update reads: from its last engine chunk's start
    (``output_rows`` rounded down to ``chunk``), less the halo."""
    return output_rows % chunk + halo


def tail_digest(tail: InputTail) -> str:
    """A hash of everything ``tail`` holds, recorded with the output's input digest when the tail is kept:
    a tail file rewritten, or left by another run, does not match it."""
    h = hashlib.blake2b(digest_size=16)
    rows = np.ascontiguousarray(tail.rows)
    for part in (np.int64(tail.start).tobytes(), f"{rows.dtype.str}{rows.shape}".encode(), rows.tobytes(),
                 np.ascontiguousarray(tail.state, dtype=np.float64).tobytes(), tail.fingerprint.encode()):  # fmt: skip
        h.update(np.int64(len(part)).tobytes())
        h.update(part)
    return h.hexdigest()


def _path(output: Path) -> Path:
    return Path(output) / "values" / TAIL_FILE


def write_tail(output: Path | StoreURL, tail: InputTail) -> bool:
    """Keep ``tail`` with the output at ``output`` (atomically: a kill leaves the old file or the new one);
    whether it was kept. One over :data:`MAX_TAIL_BYTES`, an object-store output, or a file that cannot be
    written (the rows are only a shortcut for the next update) keeps none."""
    if isinstance(output, StoreURL):
        return False
    path = _path(output)
    if tail.rows.nbytes <= MAX_TAIL_BYTES:
        tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, start=np.int64(tail.start), rows=tail.rows, state=tail.state.astype(np.float64),
                         fingerprint=np.array(tail.fingerprint))  # fmt: skip
            os.replace(tmp, path)
            return True
        except OSError:
            tmp.unlink(missing_ok=True)
    try:
        remove_tail(output)
    except OSError:  # a directory in its place, say: no recorded hash matches it
        pass
    return False


def remove_tail(output: Path | StoreURL) -> None:
    """Drop the rows kept with ``output`` (a run that could not keep its own must not leave an older run's)."""
    if not isinstance(output, StoreURL):
        _path(output).unlink(missing_ok=True)


def read_tail(
    output: Path | StoreURL,
    *,
    stop: int,
    n_features: int,
    dtype: np.dtype,
    n_inputs: int,
    fingerprint: str,
    digest: str | None,
) -> InputTail | None:
    """The rows kept with ``output`` where they were kept for its ``fingerprint`` (a file copied from another
    output, of other columns say, is not), hash to ``digest`` (:func:`tail_digest`, recorded when they were
    kept; None: none recorded), end at input row ``stop`` and have the input's ``n_features`` and ``dtype``
    (their state ``n_inputs`` values); else None."""
    if isinstance(output, StoreURL) or digest is None:
        return None
    try:
        if not _sizes_fit(_path(output)):
            return None
        with np.load(_path(output), allow_pickle=False) as z:
            start, rows, state, owner = int(z["start"]), z["rows"], z["state"], z["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError):
        return None
    if (
        owner.shape != ()
        or owner.dtype.kind != "U"
        or str(owner) != fingerprint
        or rows.ndim != 2
        or rows.shape[1] != n_features
        or rows.dtype != np.dtype(dtype).newbyteorder("=")  # kept in native order, as the reader gives rows
        or state.shape != (n_inputs,)
        or state.dtype != np.float64
        or start < 0
        or start + rows.shape[0] != stop
    ):
        return None
    tail = InputTail(start, rows, state, fingerprint)
    return tail if tail_digest(tail) == digest else None


def _sizes_fit(path: Path) -> bool:
    """Whether every array in the .npz file at ``path`` declares no more data than its member holds, and
    none more than a kept tail's: numpy allocates what a header declares before reading the data (a few
    bytes declaring 10^12 rows were an out-of-memory error failing the update)."""
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.file_size > MAX_TAIL_BYTES + 4096:
                return False
            with zf.open(info) as f:
                shape, dtype = read_npy_header(f)
                if dtype.hasobject or math.prod(shape) * dtype.itemsize > info.file_size:
                    return False
    return True


class TailedReader(BandReader):
    """``reader``, with rows [tail.start, tail.stop) served from ``tail`` (reads across its end are joined)."""

    def __init__(self, reader: BandReader, tail: InputTail) -> None:
        self._reader, self._tail = reader, tail
        for name in ("rows", "n_features", "band_rows", "dtype", "where", "fast", "fallback_reason", "pinned",
                     "hold", "ring_bands", "threads", "file_reads", "on_device", "kind"):  # fmt: skip
            setattr(self, name, getattr(reader, name))

    def read(self, start: int, stop: int) -> np.ndarray:
        t = self._tail
        if stop <= t.start or start >= t.stop:
            return self._reader.read(start, stop)
        if t.start <= start and stop <= t.stop:
            return t.rows[start - t.start : stop - t.start]
        parts = []
        if start < t.start:
            parts.append(np.array(self._reader.read(start, t.start)))
        parts.append(t.rows[max(start, t.start) - t.start : min(stop, t.stop) - t.start])
        if stop > t.stop:
            parts.append(self._reader.read(t.stop, stop))
        return np.concatenate(parts, axis=0)

    @property
    def busy_seconds(self) -> float:
        return self._reader.busy_seconds

    def verify(self, stop: int) -> None:
        self._reader.verify(stop)

    def narrow(self, features: np.ndarray) -> None:
        self._reader.narrow(features)

    def close(self) -> None:
        self._reader.close()
