"""A GPU process's start-up costs are paid in threads off the run's critical path (tsconv.kernels.early)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("triton")

# A fresh interpreter: the key is computed once per process, so an earlier test's launch would hide it. The
# thread starts before torch's import, as the CLI starts it, and imports Triton beside it.
SCRIPT = """
import sys
import threading
from tsconv.kernels import early
early.start(cuda=False)
early.start(cuda=False)  # once per process
import torch
import tsconv.engine.api
early.wait_triton()
assert [t.name for t in threading.enumerate() if t.name.startswith("tsconv-early")] == []
from triton.runtime.cache import triton_key
assert triton_key.cache_info().currsize == 1, triton_key.cache_info()
hits = triton_key.cache_info().hits
triton_key()
assert triton_key.cache_info().hits == hits + 1  # the launches' lookup is now a cache hit
print("ok")
"""


def test_the_key_thread_fills_tritons_cache_once_beside_torchs_import() -> None:
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"


def test_the_module_imports_neither_torch_nor_triton() -> None:
    code = "import sys, tsconv.kernels.early; print(sorted({'torch', 'triton'} & set(sys.modules)))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


GPU_SCRIPT = """
import torch
from tsconv.kernels import early
early.start()
import tsconv.engine.api
for t in list(early._threads.values()):
    t.join()
assert torch.cuda.is_initialized()
import triton
d = triton.runtime.driver  # the driver the launches use was made by the thread (Triton 3.4+ or a LazyProxy)
assert getattr(d, "_default", None) is not None or getattr(d, "_obj", None) is not None
print("ok")
"""


@pytest.mark.gpu
def test_the_threads_leave_cuda_and_tritons_driver_ready() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    p = subprocess.run([sys.executable, "-c", GPU_SCRIPT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"


def _aten_ops(fn) -> set[str]:  # noqa: ANN001
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith("aten::")}


def test_the_cuda_thread_warms_every_torch_op_the_level_calls() -> None:
    """The CUDA thread's first calls (early.level_ops) are the batched engine's level ops, at its tail length:
    a change to tsconv.engine.level that the warm-up does not follow fails here."""
    import torch

    from tsconv.engine.level import TAIL_ROWS, level_before_torch
    from tsconv.kernels import early

    assert early.LEVEL_TAIL == TAIL_ROWS
    g = torch.Generator().manual_seed(0)
    tail = torch.randn(TAIL_ROWS, 6, generator=g) * 100
    tail[0, 1], tail[2, 3], tail[:, 4] = float("nan"), float("inf"), float("nan")
    state = torch.tensor([1.0, float("nan"), 3.0, float("inf"), 5.0, float("nan")])
    want = torch.empty(6)
    level = _aten_ops(lambda: level_before_torch(tail, state, want))
    empty, out = tail[:0], torch.empty(6)  # step 0's level: no rows before it
    level |= _aten_ops(lambda: level_before_torch(empty, state, out))
    got = state.clone()
    warm = _aten_ops(lambda: early.level_ops(tail, got))
    assert level and level <= warm, sorted(level - warm)
    assert torch.equal(
        got.nan_to_num(-1.0), want.nan_to_num(-1.0)
    )  # the same computation, not just the names
