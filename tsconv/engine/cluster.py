"""The local dask cluster of ``--workers N``, and its early start.

A worker process pays an interpreter's start-up (importing torch and tsconv's engine, 2-3 s on the H200) before
it can run a task; inside a `tsconv process --workers 1` command that start-up came after the client's own and
made the command take 2.1x a single process's wall time (benchmarks/NOTES.md, section 17). So the CLI starts
the cluster in a thread before it imports the engine (:func:`start_early`), the workers import the engine as
they start (dask's ``preload``: :mod:`tsconv.engine.worker_init`), and the run takes that cluster
(:func:`local_cluster`) once it knows what it needs. This module imports neither torch nor dask at import time.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import sys
import threading
from typing import Any

from tsconv import config
from tsconv.errors import TsconvError, first_line

__all__ = ["discard_early", "gpu_worker_here", "gpus_here", "local_cluster", "start_early"]

_PRELOAD = ["tsconv.engine.worker_init"]
# dask's own log level in a local cluster: a failed task's traceback was logged by its worker before the
# command's one-line error (which the client raises with the task's error)
_QUIET = logging.CRITICAL
# No dashboard, and the scheduler's HTTP server (which it starts anyway, on 8787 by default) on a free port: a
# second command's cluster warned "Port 8787 is already in use"
_NO_DASHBOARD: dict[str, Any] = {"dashboard_address": ":0", "scheduler_kwargs": {"dashboard": False}}
# dask's statistical profiler samples every worker thread's stack each 10 ms under the GIL, for a dashboard
# these clusters do not serve: off, `--workers 1 --device cpu` on 400,000 x 64 took 0.93-1.28 s against
# 1.17-1.78 s (VM, three alternations; benchmarks/NOTES.md, section 17)
_NO_PROFILE = {"distributed.worker.profile.enabled": False}
_GPU_ARGV = [["--gpu"]]  # the preload's arguments in a GPU worker
_lock = threading.Lock()
_early: dict[str, Any] | None = None  # the cluster start_early began: its key, thread, and result or error


def _valid_workers(workers: Any) -> bool:
    return not isinstance(workers, bool) and isinstance(workers, int) and 1 <= workers <= max_workers()


def max_workers() -> int:
    """The most worker processes a local cluster starts: 4 per CPU core (100,000 asked for on 2 cores had
    dask create worker directories until the run was killed)."""
    return 4 * (os.cpu_count() or 1)


# dask starts a local cluster's worker processes with multiprocessing's spawn, which runs the caller's script
# again in each (as ``__mp_main__``): a script's top level outside this guard runs in every worker
_GUARD = re.compile(r"""__name__\s*==\s*['"]__main__['"]""")
_GUARD_HINT = (
    'put the script\'s work under `if __name__ == "__main__":` (dask starts each worker process by running '
    "the script again, all but that block)"
)


def _bootstrapping() -> bool:
    """Whether this process is a spawned worker still running its parent's script (multiprocessing's
    bootstrapping phase, which its own ``_check_not_importing_main`` reads the same way)."""
    return bool(getattr(multiprocessing.current_process(), "_inheriting", False))


def _unguarded_script() -> str | None:
    """The script a spawned worker process runs again, where it has no ``if __name__ == "__main__":`` guard;
    else None (an interactive interpreter, ``python -c``, ``python -m tsconv``, whose ``__main__`` a spawned
    process does not run again, and tsconv's own console script, which is guarded)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if path is None or (name is not None and name.endswith("__main__")):
        return None
    try:
        text = open(path, encoding="utf-8", errors="replace").read()  # noqa: PTH123 - one read, a str path
    except OSError:
        return None
    return None if _GUARD.search(text) else str(path)


def check_workers(workers: Any) -> None:
    """``workers`` is a positive integer a local cluster can start here."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise TsconvError(f"workers must be a positive integer, got {workers!r}")
    if _bootstrapping():
        # a worker process of the caller's own cluster, running the caller's script again: refused before it
        # touches the output (it was refused as a "second writer" of it, naming the caller's pid, or, past that,
        # started a cluster of its own and failed in multiprocessing's bootstrapping check)
        raise TsconvError(
            f"workers={workers} asked in a worker process of a dask cluster as it started: it runs the script "
            "that started the cluster again, and that script's top level calls tsconv.process(workers=...)",
            hint=_GUARD_HINT + ".",
        )
    if workers > max_workers():
        raise TsconvError(
            f"workers={workers:,} is more than a local cluster starts here ({max_workers()}: 4 per CPU core)",
            hint="ask for fewer, or start a dask cluster of your own and pass its scheduler (--scheduler ADDRESS).",
        )


def _env_gpus() -> list[str] | None:
    """The GPUs CUDA_VISIBLE_DEVICES lists, or None where it is unset."""
    env = config.cuda_visible_devices()
    return None if env is None else [d.strip() for d in env.split(",") if d.strip()]


def _driver_gpus() -> list[str] | None:
    """The GPUs a worker may use as the driver and CUDA_VISIBLE_DEVICES say, without torch; None where the
    driver's list cannot be read (the caller then asks torch)."""
    env = _env_gpus()
    if env is not None:
        return env
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return None


def gpu_worker_here(workers: Any, device: str = "auto") -> bool:
    """Whether the cluster ``--workers`` asks for is one GPU worker in this process (as the driver lists the
    GPUs, without torch): its GPU start-up can then begin with this process's own."""
    if not _valid_workers(workers) or device == "cpu":
        return False
    gpus = _driver_gpus()
    return gpus is not None and len(gpus[:workers]) == 1


def gpus_here(device: str = "auto") -> bool:
    """Whether a local cluster's workers would run on CUDA: the driver's list where it can be read, else
    torch's (what :func:`local_cluster` asks), so a CPU-only host pays no CUDA start-up to learn it."""
    if device == "cpu":
        return False
    gpus = _driver_gpus()
    return bool(gpus if gpus is not None else _torch_gpus(device))


def _torch_gpus(device: str) -> list[str]:
    """The GPUs the workers use: none for device cpu or where torch sees no CUDA."""
    if device == "cpu":
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    env = _env_gpus()
    return env if env is not None else [str(i) for i in range(torch.cuda.device_count())]


def _make(workers: int, gpus: list[str]) -> tuple[Any, int | None]:
    import dask

    # a Nanny hands its worker process the configuration it was created under
    with dask.config.set(_NO_PROFILE):
        try:
            return _make_cluster(workers, gpus)
        # dask's "Nanny failed to start." was a traceback at the CLI, naming no cause
        except Exception as exc:
            what = f"the local dask cluster's {workers} worker process{'es' if workers > 1 else ''} did not start"
            script = _unguarded_script()
            if script is not None:
                raise TsconvError(
                    f"{what} ({first_line(exc)}): each "
                    f"runs the script {script!r} again as it starts, and its top level calls tsconv.process "
                    "again there",
                    hint=_GUARD_HINT + ".",
                ) from exc
            raise TsconvError(
                f"{what} ({first_line(exc)})",
                hint="see the workers' errors above (memory? a full temporary directory?); or start a dask cluster "
                "yourself and pass its scheduler (--scheduler ADDRESS, or client=).",
            ) from exc


def _make_cluster(workers: int, gpus: list[str]) -> tuple[Any, int | None]:
    from distributed import LocalCluster

    if not gpus:
        cluster = LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, preload=_PRELOAD, silence_logs=_QUIET,
            **_NO_DASHBOARD,
        )  # fmt: skip
        return cluster, max(1, (os.cpu_count() or 1) // workers)
    gpus = gpus[:workers]
    if len(gpus) == 1:
        # One GPU worker runs in this process, as threads: a worker process would pay a second interpreter's
        # start-up and CUDA context inside the command (`--workers 1` took 1.48x a single process's wall on
        # the H200, benchmarks/NOTES.md section 17), and this process computes nothing itself. It uses the
        # first GPU this process sees, which is gpus[0].
        cluster = LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=False,
            preload=_PRELOAD,
            preload_argv=_GPU_ARGV,
            silence_logs=_QUIET,
            **_NO_DASHBOARD,
        )
        return cluster, None
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        from distributed import Nanny, Scheduler, SpecCluster

        # dask pins OMP/MKL/OpenBLAS to one thread in worker processes; give each GPU worker its share
        # of the cores instead.
        share = str(max(1, (os.cpu_count() or 1) // len(gpus)))
        threads = {k: share for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        specs = {
            f"gpu-{g}": {
                "cls": Nanny,
                "options": {
                    "nthreads": 1,
                    "env": {"CUDA_VISIBLE_DEVICES": g, **threads},
                    "preload": _PRELOAD,
                    "preload_argv": _GPU_ARGV,
                },
            }
            for g in gpus
        }
        sched = {"cls": Scheduler, "options": {"dashboard_address": ":0", "dashboard": False}}
        return SpecCluster(workers=specs, scheduler=sched), None
    return LocalCUDACluster(
        CUDA_VISIBLE_DEVICES=",".join(gpus),
        threads_per_worker=1,
        preload=_PRELOAD,
        preload_argv=_GPU_ARGV,
        **_NO_DASHBOARD,
    ), None


def start_early(workers: Any, device: str = "auto") -> None:
    """Begin starting the cluster ``--workers`` asks for, in a daemon thread, before the engine's imports;
    does nothing for arguments the run will refuse, or where the GPUs cannot be listed without torch."""
    global _early
    if not _valid_workers(workers):
        return
    gpus = [] if device == "cpu" else _driver_gpus()
    if gpus is None:
        return
    try:
        import distributed  # noqa: F401  (absent: the run reports it)
    except ImportError:
        return
    state: dict[str, Any] = {"key": (workers, tuple(gpus)), "result": None, "error": None}

    def run() -> None:
        try:
            state["result"] = _make(workers, gpus)
        except BaseException as exc:  # the run starts its own cluster, and meets the error there if it stays
            state["error"] = exc

    state["thread"] = threading.Thread(target=run, name="tsconv-cluster", daemon=True)
    with _lock:
        if _early is not None:
            return
        _early = state
    state["thread"].start()


def _take(workers: int, gpus: list[str]) -> tuple[Any, int | None] | None:
    """The early cluster when it was started for these workers and GPUs (else closed); None if none."""
    global _early
    with _lock:
        state, _early = _early, None
    if state is None:
        return None
    state["thread"].join()
    if state["result"] is None:
        return None
    if state["key"] == (workers, tuple(gpus)):
        return state["result"]
    state["result"][0].close()  # torch sees other GPUs than the driver's list said: start the right one
    return None


def discard_early() -> None:
    """Close an early cluster no run took (the command failed before it, or ran without dask)."""
    global _early
    with _lock:
        state, _early = _early, None
    if state is not None:
        state["thread"].join()
        if state["result"] is not None:
            state["result"][0].close()


def local_cluster(workers: int, device: str = "auto") -> tuple[Any, int | None]:
    """A local dask cluster of ``workers`` processes; returns (cluster, torch threads per worker).

    On the CPU: a ``LocalCluster`` of one-threaded worker processes, torch using cpu_count // workers
    threads each. With GPUs (device auto or cuda, CUDA present): dask-cuda's ``LocalCUDACluster``, one
    worker per GPU, when dask_cuda is importable; else one worker process per GPU, each started with
    ``CUDA_VISIBLE_DEVICES`` set to its GPU; a single GPU worker runs in this process instead (threads, the
    first GPU it sees). ``workers`` beyond the number of GPUs are not started. The cluster
    :func:`start_early` began is taken when it matches.
    """
    check_workers(workers)
    gpus = _torch_gpus(device)
    early = _take(workers, gpus)
    return early if early is not None else _make(workers, gpus)
