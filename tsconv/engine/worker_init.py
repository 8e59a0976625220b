"""Imported by each worker of tsconv's local dask cluster as it starts (dask's ``preload``): the engine's
imports (torch, Triton's front end, tsconv) then happen while the client prepares the run, not inside the first
task (:mod:`tsconv.engine.cluster`)."""

from __future__ import annotations

import tsconv.engine.distributed  # noqa: F401
