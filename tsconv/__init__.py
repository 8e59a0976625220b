"""tsconv: causal conv1d feature pipelines for long, wide time series, streamed out of and into zarr.

Public API (imported lazily, so ``import tsconv`` is cheap and ``tsconv.conv1d`` needs neither zarr nor polars):
- :func:`process`: stream a zarr store through a pipeline into an output store or Parquet file.
- :func:`features`: run a pipeline on an in-memory [T, F] array, tensor or polars frame.
- :class:`Stream`: a pipeline over a live series: ``push`` rows, get their features (state kept in memory).
- :func:`load_pipeline`, :func:`default_pipeline`: pipeline files; :class:`Pipeline`.
- :func:`open_input`, :func:`open_store`, :func:`iter_chunks`: stores, and their rows as polars/Arrow/numpy.
- :func:`ingest`: Parquet / CSV / Arrow IPC tick files (long or wide) into a store.
- :func:`conv1d`, :func:`gemm`, :func:`conv1d_head`: the Triton kernels.
- :mod:`nn`: ``CausalConv1d`` and ``Pipeline``, torch modules over the kernels (inference; torch.compile traces them).
- :mod:`config`: the settings; the error and warning classes.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "process": "tsconv.engine.api",
    "features": "tsconv.engine.inmemory",
    "Stream": "tsconv.engine.stream",
    "Report": "tsconv.engine.report",
    "load_pipeline": "tsconv.pipeline.spec",
    "default_pipeline": "tsconv.pipeline.spec",
    "Pipeline": "tsconv.pipeline.spec",
    "open_input": "tsconv.io.store",
    "ingest": "tsconv.io.ingest",
    "open_store": "tsconv.io.frames",
    "iter_chunks": "tsconv.io.frames",
    "StoreInfo": "tsconv.io.frames",
    "conv1d": "tsconv.kernels.conv1d",
    "gemm": "tsconv.kernels.gemm",
    "conv1d_head": "tsconv.kernels.fused",
    "TsconvError": "tsconv.errors",
    "TsconvWarning": "tsconv.errors",
    "ShapeError": "tsconv.errors",
    "StoreError": "tsconv.errors",
    "PipelineError": "tsconv.errors",
    "OutputExistsError": "tsconv.errors",
    "OutputBusyError": "tsconv.errors",
    "GpuError": "tsconv.errors",
}
_MODULES = {"config": "tsconv.config", "nn": "tsconv.nn"}

__all__ = [*_EXPORTS, *_MODULES, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        msg = f"module 'tsconv' has no attribute {name!r}"
        raise AttributeError(msg)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
