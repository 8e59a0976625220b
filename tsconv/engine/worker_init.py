"""Imported by each worker of tsconv's local dask cluster as it starts (dask's ``preload``): the engine's
imports (torch, Triton's front end, tsconv) then happen while the client prepares the run, not inside the first
task (:mod:`tsconv.engine.cluster`). A GPU worker (``--gpu``) begins its GPU start-up first
(:mod:`tsconv.kernels.early`: the CUDA context, Triton's key and driver), so that it runs beside those imports
as the CLI's does; begun after them, the first task waited 0.13 s for it (H100, dask report's ``cuda_start``).
This module therefore imports nothing heavy itself: dask imports it when it creates the worker, and calls
:func:`dask_setup` just before the worker registers with the scheduler."""

from __future__ import annotations

import multiprocessing
import signal
import threading
from typing import Any

import click

from tsconv.kernels import early


@click.command()
@click.option("--gpu", is_flag=True, help="The worker computes on its GPU.")
def dask_setup(worker: Any, gpu: bool) -> None:
    """dask's preload hook: called with the worker once it is created."""
    if multiprocessing.parent_process() is not None and threading.current_thread() is threading.main_thread():
        # A worker process of the command's cluster: Ctrl-C at a terminal reaches its whole process group, and
        # each worker printed a traceback of its own before the command's one line. The command stops them.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if gpu:
        early.start()
    import tsconv.engine.distributed  # noqa: F401, PLC0415 - the engine's imports, after the GPU start-up began
