"""A GPU process's start-up costs, paid in daemon threads off a run's critical path; imports neither torch nor
Triton itself.

What a fresh process pays before its first kernel, measured on the H200 machine (benchmarks/NOTES.md, "A fresh
`tsconv process` per run"; ``benchmarks/diag/start_costs.py``): Triton's compile-cache key, a SHA-256 of its
own install (0.42-0.52 s, hashlib releases the GIL); Triton's driver (0.32-0.34 s: an ``ldconfig -p``
subprocess and its utility module); the CUDA context (0.12-0.17 s, the GIL released). The CLI starts both
threads before its first heavy import, so they run beside the main thread's imports of torch, zarr and
tsconv; :func:`tsconv.engine.run.begin_cuda` starts them (if nothing has) for library calls and dask
workers. An update or resume with ``--device auto`` starts them only once it knows its rows need the GPU (a
few rows run on the CPU, which the threads would slow). A run waits for the Triton thread before its first
launch (Triton's cache and driver have no lock), and for the CUDA thread, which also makes the first calls of
the torch ops the batched engine's level uses (each loads its CUDA module at its first launch), before it
captures a CUDA graph.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

__all__ = [
    "LEVEL_TAIL",
    "STACK_BYTES",
    "gpu_present",
    "level_ops",
    "start",
    "trim_stack",
    "wait_cuda",
    "wait_triton",
]

# CUDA reserves each thread's stack (1 KiB by default) for every thread the GPU can hold at once: on the H200,
# NVML showed a bare context at 642 MB, and at 434 MB once the limit was 256 B (benchmarks/NOTES.md, section
# 6), a sixth of the default --gpu-mem. The driver raises the limit for any launch that needs more
# (cuCtxSetLimit), so no kernel is refused; tsconv's Triton kernels need none.
STACK_BYTES = 256
_CU_LIMIT_STACK_SIZE = 0
_trimmed: set[int | None] = set()

_threads: dict[str, threading.Thread] = {}
_lock = threading.Lock()


def gpu_present() -> bool:
    """Whether the NVIDIA driver reports a GPU, without importing torch: decides only whether ``--device
    auto`` starts the threads early (where it is wrong, a run does the work itself, or a CPU run wastes a
    background hash)."""
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


def _triton() -> None:
    try:
        import triton
        from triton.runtime.cache import triton_key  # lru-cached: the launches then reuse it
    except ImportError:  # no Triton, or one without these: require_triton or the first launch says so
        return
    try:
        triton_key()
        triton.runtime.driver.active  # noqa: B018  (creates the driver, cached for the launches)
    except (OSError, RuntimeError):  # an install it cannot read, no driver: the first launch meets the same
        return


def _cuda(index: int | None) -> None:
    try:
        import torch

        if not torch.cuda.is_available():
            return
        with torch.cuda.device(torch.cuda.current_device() if index is None else index):
            torch.empty(1, device="cuda")  # creates the device's primary context
            trim_stack(index)  # the key devmem.outside_torch uses for the same device
            level_ops(torch.zeros(LEVEL_TAIL, 8, device="cuda"), torch.zeros(8, device="cuda"))
    except Exception:  # noqa: BLE001 - whatever fails here, the run's own first CUDA call meets and reports
        return


# The tail rows the batched engine's level takes (tsconv.engine.level.TAIL_ROWS; torch's sort picks its kernel
# by the sorted length, so the warm-up sorts as many).
LEVEL_TAIL = 5


def level_ops(tail: Any, state: Any) -> Any:
    """The torch ops of :func:`tsconv.engine.level.level_before_torch`, on ``tail`` [m, F] and ``state`` [F].

    Run once in the CUDA thread so that their first calls in a run find their CUDA modules loaded (torch
    loads each lazily, at its first launch: 0.14-0.18 s of a fresh run's report on the H200, inside the loop);
    tests/kernels/test_early.py checks it calls every op the level does."""
    import torch

    known = torch.where(torch.isfinite(state), state, torch.nan)
    t = torch.where(torch.isfinite(tail), tail, torch.nan)
    count = torch.isfinite(t).sum(dim=0)
    ordered = torch.sort(t, dim=0).values
    mid = ordered.gather(0, (torch.clamp(count - 1, min=0) // 2)[None, :])[0]
    return state.copy_(torch.where(count > 0, mid, known))


def trim_stack(index: int | None) -> None:
    """Lower the per-thread stack CUDA reserves in device ``index``'s primary context (None: the current
    device) to :data:`STACK_BYTES`, once per device. The caller's thread holds that context current (it has
    just made a CUDA call on the device)."""
    with _lock:
        if index in _trimmed:
            return
        _trimmed.add(index)
    try:
        ctypes.CDLL("libcuda.so.1").cuCtxSetLimit(_CU_LIMIT_STACK_SIZE, ctypes.c_size_t(STACK_BYTES))
    except (OSError, AttributeError):  # no driver library: nothing is reserved either
        return


def start(*, device_index: int | None = None, cuda: bool = True) -> None:
    """Start the Triton thread and, with ``cuda``, the CUDA context of ``device_index`` (None: the current
    device); each once per process. A process that will fork or only drive workers passes ``cuda=False``."""
    with _lock:
        if "triton" not in _threads:
            _threads["triton"] = threading.Thread(target=_triton, name="tsconv-early-triton", daemon=True)
            _threads["triton"].start()
        if cuda and "cuda" not in _threads:
            _threads["cuda"] = threading.Thread(
                target=_cuda, args=(device_index,), name="tsconv-early-cuda", daemon=True
            )
            _threads["cuda"].start()


def wait_triton() -> None:
    """Wait for :func:`start`'s Triton thread, if one was started."""
    t = _threads.get("triton")
    if t is not None:
        t.join()


def wait_cuda() -> None:
    """Wait for :func:`start`'s CUDA thread, if one was started: a run calls it before its first capture of
    a CUDA graph, which another thread's launches would break."""
    t = _threads.get("cuda")
    if t is not None:
        t.join()
