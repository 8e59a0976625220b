"""An input store as a run's source: the readers it can open (the GPU reader, or decode threads)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tsconv.io.contracts import BandReader
from tsconv.io.readers import gpu as gpu_reader
from tsconv.io.readers.prefetch import PrefetchReader
from tsconv.io.readers.threads import ParallelBandReader
from tsconv.io.store import InputStore
from tsconv.io.tail import InputTail, TailedReader

__all__ = ["StoreSource"]


class StoreSource:
    """The ``values`` of an :class:`~tsconv.io.store.InputStore` as a :class:`~tsconv.io.contracts.Source`."""

    def __init__(self, store: InputStore) -> None:
        self.store = store
        self.rows = store.rows
        self.n_features = store.n_features
        self.dtype = np.dtype(store.dtype)
        self.where = str(store.path)
        self._early: ParallelBandReader | None = None
        self._tail: InputTail | None = None

    def early_reader(self) -> ParallelBandReader | None:
        """A CPU reader opened before the run, for the checks that read input rows first (an update's
        hashes of the input's last band and the run's restart rows lie in the same bands): :meth:`open`
        hands it to a run that asks for that same reader, with the bands it decoded, so no band is decoded
        twice. None for an object store (it has no digest). :meth:`close` closes it if no run took it."""
        if self.store.remote:
            return None
        if self._early is None:
            self._early = ParallelBandReader(self.store.values, where=self.where)
        return self._early

    def use_tail(self, tail: InputTail) -> None:
        """A run's CPU reader serves rows [tail.start, tail.stop) from ``tail`` (input rows kept with the
        output, :mod:`tsconv.io.tail`) instead of decoding their bands. Only for rows the caller has checked
        are unchanged in the input; the checks themselves read through :meth:`early_reader`, never the tail."""
        self._tail = tail

    def close(self) -> None:
        """Close the reader from :meth:`early_reader` unless a run took it."""
        early, self._early = self._early, None
        if early is not None:
            early.close()

    @property
    def band_rows(self) -> int:
        return int(self.store.values.chunks[0])

    def gpu_reader(self) -> tuple[dict[int, int], str | None]:
        """({bands per decode launch: device bytes}, None), largest batch first, when the GPU decodes this
        store's chunks (Blosc-LZ4); else ({}, why not)."""
        if self.store.remote:
            return {}, "an object store (its bands are read through zarr)"
        why = gpu_reader.unsupported_reason(self.store.values)
        return ({}, why) if why is not None else (gpu_reader.device_bytes(self.store.values), None)

    def open(
        self,
        *,
        device: Any,
        pinned: bool,
        hold: int,
        gpu: bool,
        threads: int | None,
        batch: int | None = None,
    ) -> BandReader:
        reader = self._open(device=device, pinned=pinned, hold=hold, gpu=gpu, threads=threads, batch=batch)
        if self._tail is not None and not reader.on_device and not reader.pinned:
            return TailedReader(reader, self._tail)
        return reader

    def _open(
        self, *, device: Any, pinned: bool, hold: int, gpu: bool, threads: int | None, batch: int | None
    ) -> BandReader:
        early, self._early = self._early, None
        if early is not None:
            if not (gpu or pinned) and hold == early.hold and threads is None:
                return early  # the default CPU reader, as early_reader() opened it
            early.close()
        if self.store.remote:  # the fast readers read local chunk files; objects are fetched ahead instead
            return PrefetchReader(self.store.values, where=self.where, hold=hold)
        if gpu:
            return gpu_reader.GpuBandReader(
                self.store.values, device=device, where=self.where, threads=threads, batch=batch
            )
        return ParallelBandReader(self.store.values, where=self.where, pin=pinned, hold=hold, threads=threads)
