"""Triton's per-process cache key is computed off the run's critical path (tsconv.kernels.torch_side)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("triton")

# A fresh interpreter: the key is computed once per process, so an earlier test's launch would hide it.
SCRIPT = """
import time
from triton.runtime.cache import triton_key
from tsconv.kernels import torch_side
assert triton_key.cache_info().currsize == 0
torch_side.start_triton_key()
torch_side.start_triton_key()  # once per process
torch_side.wait_triton_key()
assert triton_key.cache_info().currsize == 1, triton_key.cache_info()
t0 = time.perf_counter()
triton_key()
assert time.perf_counter() - t0 < 0.01  # the launches' lookup is now a cache hit
print("ok")
"""


def test_the_key_thread_fills_tritons_cache_once() -> None:
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ok"
