"""Offline compilation for sm_90 (Triton's bundled ptxas), shared by the kernel tests."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Prepended to every compile script: what compiling one kernel for sm_90 and reading ptxas's report take.
HELPERS = r"""
import os, re, subprocess, tempfile
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

LAUNCHER_KEYS = ("A16", "TMA")  # config keys the launchers act on, not kernel parameters


def i32(name, spec=""):
    return (name, "i32", spec)


def build(fn, runtime, consts, cfg):
    # runtime: (name, type, spec) with spec "D" (divisible by 16), "1" (the constant 1) or "";
    # consts and cfg.meta: constexprs
    sig, constexprs, attrs = {}, {}, {}
    for name, ty, spec in runtime:
        idx = fn.arg_names.index(name)
        if spec == "1":
            sig[name] = "constexpr"
            constexprs[(idx,)] = 1
        else:
            sig[name] = ty
            if spec == "D":
                attrs[(idx,)] = [["tt.divisibility", 16]]
    meta = {k: v for k, v in cfg.meta.items() if k not in LAUNCHER_KEYS}
    for name, value in {**consts, **meta}.items():
        sig[name] = "constexpr"
        constexprs[(fn.arg_names.index(name),)] = value
    opts = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if getattr(cfg, "maxnreg", None):
        opts["maxnreg"] = cfg.maxnreg
    ck = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", 90, 32), options=opts)
    assert ck.asm["cubin"], "no cubin"
    return ck


def ptxas_usage(ck):
    # (registers, spilled bytes) from ptxas -v on the kernel's PTX
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as fh:
            fh.write(ck.asm["ptx"])
        proc = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", ptx, "-o",
                               os.path.join(tmp, "k.cubin")], capture_output=True, text=True, check=True)
    info = proc.stdout + proc.stderr
    spills = [int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    regs = [int(v) for v in re.findall(r"Used (\d+) registers", info)]
    assert spills and regs, info
    return max(regs), max(spills)
"""


def run_compile_script(script: str) -> str:
    """Run :data:`HELPERS` then ``script`` in a fresh interpreter without TRITON_INTERPRET; skip when no
    ptxas exists.

    Returns its stdout; fails the test unless it exits 0 and prints "compiled OK".
    """
    pytest.importorskip("triton.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", HELPERS + script],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    if proc.returncode != 0 and ("ptxas" in proc.stderr and "not found" in proc.stderr):
        pytest.skip("no ptxas available to compile for sm_90")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "compiled OK" in proc.stdout
    return proc.stdout
