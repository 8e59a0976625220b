"""The GPU memory a CUDA process holds outside torch's allocator, which ``--gpu-mem`` counts too.

nvidia-smi shows for a process its CUDA context, the kernels it has loaded (torch's, Triton's) and library
state beside what torch's caching allocator reserves: 715 MB beyond torch's reservation on the H200 machine,
the same at every budget from 0.4 to 1.2 GB (benchmarks/NOTES.md, section 6). ``--gpu-mem`` bounds the
whole, so a run's step budget is ``--gpu-mem`` less that share, measured through NVML (this process's
entry on the device) when the run is planned, plus what loading the run's kernels adds later.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from tsconv.kernels import early

__all__ = [
    "LATER_MODULES_BYTES",
    "SETTLED_BYTES",
    "UNMEASURED_BYTES",
    "after_run",
    "outside_torch",
    "process_bytes",
]

_stepped: set[str] = set()  # devices (by UUID) this process has run steps on

# Taken after planning, outside the allocator, at a run's first launches: the context's lazily made
# state (local memory for every thread the GPU can hold) and the kernels. The H200 machine's process held
# 172 MB more at the end of a run than at its planning, beyond torch's reservation, for every built-in
# pipeline and a dense one alike (benchmarks/diag/gpu_outside.py; benchmarks/NOTES.md, section 6).
LATER_MODULES_BYTES = 176 << 20
# Once a run has stepped on a device, NVML's figure holds that state: a later run in the process may only
# load a few kernels of its own (each well under a MiB).
SETTLED_BYTES = 32 << 20
# Where NVML cannot say (no nvidia-ml-py, or a process namespace it does not see): the H200 machine's
# measured total, rounded up.
UNMEASURED_BYTES = 768 << 20


@functools.cache
def _nvml() -> Any:  # noqa: ANN401 - the pynvml module, or None
    try:
        import pynvml  # nvidia-ml-py, NVIDIA's own binding of the driver's library
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver library, no permission: NVML cannot say
        return None
    return pynvml


def process_bytes(device: torch.device) -> int | None:
    """What this process holds on ``device`` as nvidia-smi shows it (NVML), or None where NVML cannot
    say: not installed, or this process not among the device's (another PID namespace)."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        uuid = _uuid(device)
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # noqa: BLE001 - an NVML that does not know the call or the device
        return None
    pid = os.getpid()
    used = [p.usedGpuMemory for p in procs if p.pid == pid and p.usedGpuMemory is not None]
    if not used:
        return None
    held = int(sum(used))
    # a driver that cannot account per process may report a sentinel rather than nothing
    return held if held <= torch.cuda.mem_get_info(device)[1] else None


def outside_torch(device: torch.device) -> int:
    """Bytes of ``device`` this process holds, or will once the run's kernels load, beyond what torch's
    allocator reserves: the share of ``--gpu-mem`` the steps cannot have. Creates the CUDA context (the
    run needs it next anyway)."""
    # The early CUDA thread (tsconv.kernels.early) may still be loading the modules of its warm-up ops: read
    # before it ends, NVML showed a dask worker less than it would hold, and its steps grew past --gpu-mem
    # (31,744 rows against 25,600 on the H100, and a new shape class to tune).
    early.wait_cuda()
    torch.cuda.mem_get_info(device)  # creates the context where nothing has yet: it is in what follows
    early.trim_stack(device.index)  # before NVML is read: what it frees goes to the steps
    reserved = torch.cuda.memory_reserved(device)
    held = process_bytes(device)
    if held is None:
        return UNMEASURED_BYTES
    later = SETTLED_BYTES if _uuid(device) in _stepped else LATER_MODULES_BYTES
    return max(held - reserved, 0) + later


def after_run(device: torch.device) -> int | None:
    """At the end of a run's steps on ``device``: what the process holds there (:func:`process_bytes`),
    and from now on its plans count only :data:`SETTLED_BYTES` for what later runs load."""
    _stepped.add(_uuid(device))
    return process_bytes(device)


def _uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)
