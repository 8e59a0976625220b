"""Imported by each worker of tsconv's local dask cluster as it starts (dask's ``preload``): the engine's
imports (torch, Triton's front end, tsconv) then happen while the client prepares the run, not inside the first
task (:mod:`tsconv.engine.cluster`). A GPU worker (``--gpu``) also begins its GPU start-up there
(:mod:`tsconv.kernels.early`: the CUDA context, Triton's key and driver)."""

from __future__ import annotations

import multiprocessing
import signal
import threading
from typing import Any

import click

import tsconv.engine.distributed  # noqa: F401
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
