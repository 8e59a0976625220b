"""What conv1d's launchers share at run time: the module switches, the launch plans, the last launch.

The switches choose the kernels' arithmetic; tests flip them (``monkeypatch.setattr(state, "FLUSH", False)``)
to show what each one is for, and a call's plan key includes them, so a launch recorded before a flip is never
replayed after it. Plans are recorded by the family launchers (:mod:`~tsconv.kernels.conv1d.dense`,
:mod:`~tsconv.kernels.conv1d.direct`) and replayed by :mod:`~tsconv.kernels.conv1d.api`, hence here, below
both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tsconv.kernels import autotune
from tsconv.kernels.conv1d.spec import ConvSpec
from tsconv.kernels.launch import LaunchPlan, PlanCache

__all__ = [
    "A_SPLIT",
    "DIRECT_SLOTS",
    "FLUSH",
    "FORCE_INDEX64",
    "PLANS",
    "POINTER_SLOTS",
    "PREP_A16",
    "PREP_NONE",
    "PREP_ROUND",
    "ROUND_X_TF32",
    "TMA_SLOTS",
    "ConvPlan",
    "last_launch",
]

# "fp32": each reduction step's products summed in a fresh tensor-core accumulator, then added on the CUDA
# cores; False accumulates in the tensor core (the scheme the tensor-core model shows failing).
FLUSH = True
# "fp32", float32 x: 3 = hi + mid + lo, each exact in TF32; 2 = hi + a 13-bit remainder the tensor core
# truncates (fails under the same model).
A_SPLIT = 3
# "tf32": round float32 x to TF32 (ties to even) in a pre-pass; tests switch it off to get truncation.
ROUND_X_TF32 = True
# Tests set this to exercise the 64-bit indexing variant on small tensors.
FORCE_INDEX64 = False
# Which kernel and config the last Triton launch used (benchmarks report it): {"path": ..., "config": ...}.
last_launch: dict[str, str] = {}

# A tf32 / fp16 dense call through the TMA kernel cost 0.12-0.30 ms of host time on the H200 hosts with the
# full path (validation, the tuner lookup, Triton's argument binding; benchmarks/NOTES.md, "Launch plans and
# weight caches"), more than its kernel for small batches; a plan replays the recorded launch with the call's
# tensors.
PREP_NONE, PREP_A16, PREP_ROUND = 0, 1, 2
POINTER_SLOTS = ("x_ptr", "w_ptr", "wlo_ptr", "b_ptr", "s_ptr", "f_ptr", "y_ptr")
DIRECT_SLOTS = ("x_ptr", "w_ptr", "b_ptr", "s_ptr", "f_ptr", "y_ptr")  # the direct, bank and window kernels
TMA_SLOTS = ("x_desc", "w_desc", "w_ptr", "b_ptr", "y_ptr")
PLANS = PlanCache(64)
autotune.on_clear(PLANS.clear)  # plans embody the tuner's winners


@dataclass(frozen=True)
class ConvPlan:
    """A recorded launch and what its replay needs besides the call's tensors."""

    plan: LaunchPlan
    path: str  # last_launch's path: "dense", "direct", "bank" or "window"
    config: str
    spec: ConvSpec
    extents: tuple[int, int, int, int]  # byte extents of (out, x, weight, bias): see launch.extent
    # direct, bank and window kernels: weight tensor -> the kernel's packed copy (cached per tensor)
    pack: Callable[[torch.Tensor], torch.Tensor] | None = None
    prep: int = 0  # dense: PREP_*, the pass that makes the kernel's copy of x, if any
    tma: tuple | None = None  # dense: (x block, weight block or None, round_tf32) for the TMA kernel
