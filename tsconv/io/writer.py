"""The output store: created up front, written in whole chunks, marked complete only at the end.

Layout: a zarr (format 3) group with ``values`` [T, D] float32, ``time`` copied from the input when it
has one, and attributes ``features`` (output names), ``pipeline`` (as run), ``source`` and ``tsconv``
(``complete``, ``rows_done``, ``fingerprint``, ...). Every write covers whole chunks, and ``rows_done``
advances only after the chunk's data is stored (zarr's local store writes each file atomically), so a
run killed at any moment resumes from ``rows_done`` and rewrites anything after it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec

from ..errors import OutputExistsError, StoreError
from .store import is_zarr_store

__all__ = ["OutputWriter", "prepare_output", "output_chunk_rows", "FORMAT_VERSION"]

FORMAT_VERSION = 1
_TARGET_CHUNK_BYTES = 16 << 20  # ~16 MB chunks read back fastest (see ../shared/FACTS.md)


def output_chunk_rows(chunk: int, n_outputs: int) -> int:
    """Rows per output chunk: a multiple of the engine's chunk, about 16 MB."""
    per_chunk = chunk * n_outputs * 4
    return chunk * max(1, _TARGET_CHUNK_BYTES // max(per_chunk, 1))


def _codec() -> BloscCodec:
    return BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")


def prepare_output(
    path: Path, *, input_path: Path, overwrite: bool, resume: bool, fingerprint: str
) -> tuple[str, int]:
    """Decide what to do with ``path``: returns (action, rows_done), action one of create/resume/done.

    Refuses to touch the input, a path that is not a zarr store, or an existing output without
    ``overwrite`` or ``resume``.
    """
    out, inp = path.resolve(), input_path.resolve()
    if out == inp or inp.is_relative_to(out) or out.is_relative_to(inp):
        raise StoreError(
            f"output {str(out)!r} would overlap the input store {str(inp)!r}",
            hint="choose an output path outside the input store; tsconv never writes into its input.",
        )
    if not out.exists():
        return "create", 0
    if not is_zarr_store(out):
        raise StoreError(
            f"output path {str(out)!r} exists and is not a zarr store; refusing to replace it",
            hint="remove it yourself or choose another --output.",
        )
    if resume:
        try:
            meta = dict(zarr.open_group(str(out), mode="r").attrs.get("tsconv", {}))
        except Exception as exc:
            raise StoreError(f"cannot resume into {str(out)!r}: {exc}") from None
        if meta.get("fingerprint") != fingerprint:
            raise StoreError(
                f"cannot resume into {str(out)!r}: it was written by a different input, pipeline or chunk size",
                hint="use --overwrite to start again.",
            )
        if meta.get("complete"):
            return "done", int(meta["rows"])
        return "resume", int(meta.get("rows_done", 0))
    if overwrite:
        shutil.rmtree(out)
        return "create", 0
    raise OutputExistsError(
        f"output store {str(out)!r} already exists",
        hint="pass --overwrite to replace it or --resume to finish an interrupted run.",
    )


class OutputWriter:
    """Buffers rows into whole output chunks and writes them in order."""

    def __init__(
        self,
        group: zarr.Group,
        *,
        time_source: Any | None,
        start: int,
        stop: int | None = None,
        record: bool = True,
    ) -> None:
        """Write rows [start, stop) (default: to the end). ``record``: advance ``tsconv.rows_done`` and mark
        the store complete; a region writer (one of several dask tasks) leaves the attributes alone."""
        self.group = group
        self.values = group["values"]
        self.time_out = group["time"] if "time" in group.array_keys() else None
        self.time_source = time_source
        self.rows = int(self.values.shape[0])
        self.chunk_rows = int(self.values.chunks[0])
        if start % self.chunk_rows and start != self.rows:
            msg = f"resume point {start} is not on a chunk boundary of {self.chunk_rows} rows"
            raise StoreError(msg)
        self.stop = self.rows if stop is None else stop
        if self.stop % self.chunk_rows and self.stop != self.rows:
            msg = f"region end {self.stop} is not on a chunk boundary of {self.chunk_rows} rows"
            raise StoreError(msg)
        self.record = record
        self.rows_done = start
        self._buf = np.empty((self.chunk_rows, self.values.shape[1]), dtype=np.float32)
        self._fill = 0

    @classmethod
    def create(
        cls,
        path: Path,
        *,
        rows: int,
        names: tuple[str, ...],
        chunk_rows: int,
        time_source: Any | None,
        attrs: dict[str, Any],
    ) -> OutputWriter:
        # Build the empty store beside its final place and rename it in: a kill during creation then
        # leaves no half-made store at ``path`` that a later --resume would have to refuse.
        tmp = path.with_name(f".{path.name}.creating")
        if tmp.exists():
            shutil.rmtree(tmp)
        group = zarr.open_group(str(tmp), mode="w-", zarr_format=3)
        group.create_array(
            "values",
            shape=(rows, len(names)),
            chunks=(min(chunk_rows, rows), len(names)),
            dtype="float32",
            compressors=[_codec()],
            fill_value=np.nan,
        )
        if time_source is not None:
            group.create_array(
                "time", shape=(rows,), chunks=(min(chunk_rows, rows),), dtype="int64", compressors=[_codec()]
            )
        group.attrs.update({**attrs, "features": list(names)})
        tmp.rename(path)
        return cls(zarr.open_group(str(path), mode="r+"), time_source=time_source, start=0)

    @classmethod
    def reopen(cls, path: Path, *, time_source: Any | None, start: int) -> OutputWriter:
        group = zarr.open_group(str(path), mode="r+")
        return cls(group, time_source=time_source, start=start)

    @classmethod
    def region(cls, path: Path, *, time_source: Any | None, start: int, stop: int) -> OutputWriter:
        """A writer of the chunk-aligned rows [start, stop) only, which never touches the attributes."""
        group = zarr.open_group(str(path), mode="r+")
        return cls(group, time_source=time_source, start=start, stop=stop, record=False)

    def append(self, block: np.ndarray) -> None:
        """Add the next rows, in order; full chunks are written at once."""
        n, i = block.shape[0], 0
        while i < n:
            take = min(n - i, self.chunk_rows - self._fill)
            self._buf[self._fill : self._fill + take] = block[i : i + take]
            self._fill += take
            i += take
            if self._fill == self.chunk_rows or self.rows_done + self._fill == self.stop:
                self._flush()

    def _flush(self) -> None:
        a, b = self.rows_done, self.rows_done + self._fill
        self.values[a:b] = self._buf[: self._fill]
        if self.time_out is not None:
            self.time_out[a:b] = np.asarray(self.time_source[a:b]).astype(np.int64)
        self.rows_done = b
        self._fill = 0
        if self.record:
            self._set_meta(rows_done=b)

    def _set_meta(self, **changes: Any) -> None:
        meta = dict(self.group.attrs.get("tsconv", {}))
        meta.update(changes)
        meta = {k: v for k, v in meta.items() if v is not None or k not in changes}
        self.group.attrs["tsconv"] = meta

    def finish(self) -> None:
        """Mark the store complete; readers may trust it from now on (a region writer: just flush)."""
        if self._fill:
            self._flush()
        if self.rows_done != self.stop:
            msg = f"internal error: finished with {self.rows_done} of {self.stop} rows written"
            raise RuntimeError(msg)
        if self.record:
            self._set_meta(complete=True, rows_done=self.rows, partitions_done=None)  # None: drop the key
