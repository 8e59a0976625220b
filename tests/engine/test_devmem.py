"""What a CUDA process holds outside torch's allocator, the share of --gpu-mem its steps cannot have: read
from NVML's entry for this process (a stand-in NVML here; the GPU tests check the bound on a device)."""

from __future__ import annotations

import os
import sys
import types
import uuid

import pytest
import torch

from tsconv.engine import devmem

UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def _fake_nvml(procs: list[tuple[int, int | None]], *, init_fails: bool = False) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    seen: list[str] = []

    def init() -> None:
        if init_fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def by_uuid(text: str) -> str:
        seen.append(text)
        if text != f"GPU-{UUID}":
            raise RuntimeError("Not Found")
        return "handle"

    m.nvmlInit = init
    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs
    ]
    m.seen = seen
    return m


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """A CUDA device as far as devmem asks: its UUID, free memory, torch's reservation (100 MB)."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(uuid=UUID))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (10**10, 10**11))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 100_000_000)
    monkeypatch.setattr(devmem, "_stepped", set())
    devmem._nvml.cache_clear()
    yield torch.device("cuda", 0)
    devmem._nvml.cache_clear()


def test_the_process_share_is_its_own_nvml_entry_beyond_torchs_reservation(device, monkeypatch) -> None:
    nvml = _fake_nvml([(os.getpid() + 1, 9_000_000_000), (os.getpid(), 700_000_000)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert devmem.process_bytes(device) == 700_000_000  # another process's 9 GB is not ours
    assert devmem.outside_torch(device) == 600_000_000 + devmem.LATER_MODULES_BYTES
    assert nvml.seen[0] == f"GPU-{UUID}"


@pytest.mark.parametrize(
    "case",
    [
        "not installed",
        "no driver library",
        "this process not listed",
        "no usage reported",
        "a sentinel figure",
    ],
)
def test_where_nvml_cannot_say_the_share_is_the_measured_estimate(device, monkeypatch, case) -> None:
    if case == "not installed":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    else:
        procs = {"this process not listed": [(os.getpid() + 1, 10**9)],
                 "no usage reported": [(os.getpid(), None)],
                 "a sentinel figure": [(os.getpid(), 2**64 - 1)]}.get(case, [])  # fmt: skip
        monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(procs, init_fails=case == "no driver library"))
    assert devmem.process_bytes(device) is None
    assert devmem.outside_torch(device) == devmem.UNMEASURED_BYTES


def test_after_a_run_has_stepped_later_plans_count_only_a_few_new_kernels(device, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([(os.getpid(), 900_000_000)]))
    assert devmem.outside_torch(device) == 800_000_000 + devmem.LATER_MODULES_BYTES  # a fresh process
    assert devmem.after_run(device) == 900_000_000
    # the context's lazily made state and the run's kernels are in NVML's figure now
    assert devmem.outside_torch(device) == 800_000_000 + devmem.SETTLED_BYTES


def test_the_share_is_read_once_the_early_cuda_thread_has_loaded_its_modules(device, monkeypatch) -> None:
    # A dask worker planned while tsconv.kernels.early's thread still loaded the warm-up ops' modules: NVML
    # showed less than the run then held, and its steps grew past --gpu-mem.
    import threading
    import time

    from tsconv.kernels import early

    procs = [(os.getpid(), 500_000_000)]
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(procs))

    def warm_up() -> None:
        time.sleep(0.3)
        procs[0] = (os.getpid(), 700_000_000)

    thread = threading.Thread(target=warm_up)
    monkeypatch.setitem(early._threads, "cuda", thread)
    thread.start()
    assert devmem.outside_torch(device) == 600_000_000 + devmem.LATER_MODULES_BYTES
