"""Triton's per-process cache key is computed off the run's critical path (tsconv.kernels.triton_key)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("triton")

# A fresh interpreter: the key is computed once per process, so an earlier test's launch would hide it. The
# thread starts before torch's import, as the CLI starts it, and imports Triton beside it.
SCRIPT = """
import sys
from tsconv.kernels import triton_key as tk
tk.start_triton_key()
tk.start_triton_key()  # once per process
import torch
import tsconv.engine.api
tk.wait_triton_key()
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
    code = "import sys, tsconv.kernels.triton_key; print(sorted({'torch', 'triton'} & set(sys.modules)))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
