"""What ``tsconv inspect`` shows about a store."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import numpy as np

from tsconv.io.readers import gpu as gpudecode
from tsconv.io.readers.blocks import BlockReader
from tsconv.io.readers.threads import fast_path_reason
from tsconv.io.store import check_time, open_input

__all__ = ["inspect_store"]


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat()


def inspect_store(path: str | os.PathLike[str], *, count_nans: bool = True) -> dict[str, Any]:
    """Describe a store; with ``count_nans`` read it once, band by band, to count NaNs per feature."""
    store = open_input(path, allow_incomplete=True)
    info = store.describe()
    if store.time is not None:
        first, last = check_time(store)
        info["time_span"] = f"{_iso(first)} .. {_iso(last)}"
    group_attrs = _group_attrs(store)
    if "tsconv" in group_attrs:
        meta = group_attrs["tsconv"]
        info["tsconv_output"] = (
            "complete"
            if meta.get("complete")
            else f"INCOMPLETE: {meta.get('rows_done', 0):,} of {meta.get('rows')} rows"
        )
    # which readers the batched engine can use on this layout (see --decode)
    fast = fast_path_reason(store.values)
    info["fast_reader"] = "yes" if fast is None else f"no ({fast}): zarr reads"
    gpu = gpudecode.unsupported_reason(store.values)
    info["gpu_decode"] = "yes" if gpu is None else f"no ({gpu})"
    info["features"] = list(store.features)
    if count_nans:
        counts = np.zeros(store.n_features, dtype=np.int64)
        if store.dtype.kind == "f":
            reader = BlockReader(store.values, max_cached=1)
            for a in range(0, store.rows, reader.band_rows):
                counts += np.isnan(reader.read(a, min(a + reader.band_rows, store.rows))).sum(axis=0)
        info["nan_total"] = int(counts.sum())
        info["nan_counts"] = {n: int(c) for n, c in zip(store.features, counts, strict=True)}
    return info


def _group_attrs(store) -> dict[str, Any]:  # noqa: ANN001
    import zarr

    try:
        node = zarr.open(str(store.path), mode="r")
    except Exception:
        return {}
    return dict(node.attrs) if isinstance(node, zarr.Group) else {}
