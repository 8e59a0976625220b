"""Offline compilation for sm_90 (Triton's bundled ptxas), shared by the kernel tests."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_compile_script(script: str) -> str:
    """Run ``script`` in a fresh interpreter without TRITON_INTERPRET; skip when no ptxas exists.

    Returns its stdout; fails the test unless it exits 0 and prints "compiled OK".
    """
    pytest.importorskip("triton.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    if proc.returncode != 0 and ("ptxas" in proc.stderr and "not found" in proc.stderr):
        pytest.skip("no ptxas available to compile for sm_90")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "compiled OK" in proc.stdout
    return proc.stdout
