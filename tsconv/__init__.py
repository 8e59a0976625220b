"""tsconv: causal conv1d feature pipelines for long, wide time series, streamed out of and into zarr.

Public API (imported lazily, so ``import tsconv.kernels`` needs neither zarr nor polars):
- :func:`process`: stream a zarr store through a pipeline into an output store.
- :func:`features`: run a pipeline on an in-memory [T, F] array.
- :func:`load_pipeline`, :func:`default_pipeline`: pipeline files.
- :func:`open_input`: open and validate an input store.
- :func:`ingest`: Parquet / CSV / Arrow IPC tick files (long or wide) into a store.
- :func:`open_store`, :func:`iter_chunks`: a store's metadata, and its rows as polars/Arrow/numpy chunks.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "process": "tsconv.engine.api",
    "features": "tsconv.engine.api",
    "Report": "tsconv.engine.api",
    "load_pipeline": "tsconv.pipeline.spec",
    "default_pipeline": "tsconv.pipeline.spec",
    "Pipeline": "tsconv.pipeline.spec",
    "open_input": "tsconv.io.store",
    "ingest": "tsconv.io.ingest",
    "open_store": "tsconv.io.frames",
    "iter_chunks": "tsconv.io.frames",
    "StoreInfo": "tsconv.io.frames",
    "TsconvError": "tsconv.errors",
    "TsconvWarning": "tsconv.errors",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'tsconv' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
