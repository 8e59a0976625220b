"""Triton's per-process cache key, computed off a run's critical path; imports neither torch nor Triton.

The first kernel launch of a process keys Triton's compile cache with a SHA-256 of Triton's own install, its
460 MB libtriton among it: 0.42-0.52 s of a fresh ``tsconv process`` on the H200 machine, inside the run
(benchmarks/NOTES.md, "A fresh `tsconv process` per run"). hashlib releases the GIL, so a thread computes it
while the main thread imports torch and opens the store. The CLI starts it before its first heavy import;
:func:`tsconv.engine.run.resolve_device` starts it (if nothing has) for library calls; the run waits for it
before its first launch, which would otherwise compute the key again beside it (Triton's cache has no lock).
"""

from __future__ import annotations

import os
import threading

__all__ = ["gpu_present", "start_triton_key", "wait_triton_key"]

_thread: threading.Thread | None = None
_lock = threading.Lock()


def gpu_present() -> bool:
    """Whether the NVIDIA driver reports a GPU, without importing torch: decides only whether ``--device
    auto`` starts the key early (where it is wrong, a run computes the key itself, or a CPU run wastes a
    background hash)."""
    try:
        return bool(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return False


def _key() -> None:
    try:
        from triton.runtime.cache import triton_key  # lru-cached: the launches then reuse it
    except ImportError:  # no Triton, or one without it: require_triton or the first launch says so
        return
    try:
        triton_key()
    except OSError:  # an install it cannot read: the first launch meets (and reports) the same
        return


def start_triton_key() -> None:
    """Start computing the key in a daemon thread (once per process)."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_key, name="tsconv-triton-key", daemon=True)
            _thread.start()


def wait_triton_key() -> None:
    """Wait for :func:`start_triton_key`'s thread, if one was started."""
    if _thread is not None:
        _thread.join()
