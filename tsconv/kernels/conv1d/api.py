"""conv1d(): validation, the launch-plan short path, the choice of kernel family, and the torch path.

``conv1d(x, weight, bias)`` computes ``F.conv1d(F.pad(x, ((K - 1) * dilation, 0)), weight, bias,
dilation=dilation, groups=groups)`` ("causal"; "valid" skips the padding) followed by an activation, reading
``x`` through any strides (in particular the [N, C, L] view of a time-major [N, L, C] buffer) and writing a
float32 result through any strides (``out=`` may be the [N, O, L] view of a time-major [N, L, O] buffer).

The kernel family follows the channels per group: at least 16 input and 16 output channels run the implicit
GEMM on tensor cores (:mod:`tsconv.kernels.conv1d.dense`, with a TMA variant on Hopper); fewer run FMAs in
float32 registers (:mod:`tsconv.kernels.conv1d.direct`), and for one input channel per group (depthwise
banks) the generated register-window kernels come first (:mod:`tsconv.kernels.conv1d.window`).

``recenter=True`` (every kernel but the TMA one, "fp32"): each program subtracts a per-channel level read at
its first output step (``common.level``: the median of x there and at the four taps before it) from the x it
loads and adds ``level * tap sum`` back in float64 before the bias, so on raw levels the rounding scales with
the moves a block sees, not with the level or its drift (the engine's first stage; benchmarks/NOTES.md,
"Precision").

A call whose layouts and options were seen before replays the recorded launch (:func:`_planned`;
benchmarks/NOTES.md, "Launch plans and weight caches"). On CUDA tensors the Triton kernels run, with block
shapes tuned per GPU and shape class and cached on disk (see :mod:`tsconv.kernels.autotune`). On CPU tensors
they run through the Triton interpreter when ``TRITON_INTERPRET=1`` was set before the kernels were imported;
otherwise CPU tensors take a torch path (F.conv1d in float32, weights upcast from their stored dtype) with the
same semantics.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from tsconv.kernels import autotune, torch_side
from tsconv.kernels.checks import ACT_NAME as _ACT_NAME
from tsconv.kernels.conv1d import state
from tsconv.kernels.conv1d.spec import ConvSpec, check_fallback, check_tap_sums, validate
from tsconv.kernels.launch import overlaps, tensor_key
from tsconv.kernels.torch_side import WEIGHTS, apply_activation, custom_op, recenter_sums
from tsconv.kernels.weight_cache import writes_out

__all__ = ["clear_weight_cache", "conv1d"]

# False (tests) sends every call through validation, the tuner lookup and kernel[grid].
_PLANS_ENABLED = True


def clear_weight_cache() -> None:
    """Forget the rearranged weights :func:`conv1d` keeps (needed only after writes that bypass torch's
    version counter, e.g. through ``.data``)."""
    WEIGHTS.clear()


# --------------------------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------------------------


@writes_out
def conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    dilation: int = 1,
    groups: int = 1,
    padding: str = "causal",
    activation: str | None = None,
    precision: str = "fp32",
    out: torch.Tensor | None = None,
    recenter: bool = False,
    recenter_from: int = 0,
    tap_sums: torch.Tensor | None = None,
    recenter_fallback: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal conv1d with fused bias and activation; returns the float32 [N, O, L_out] result.

    Args:
        x: [N, C, L] float32 (float16, bfloat16 accepted) with any strides, e.g. ``buf.transpose(1, 2)`` of a
            time-major [N, L, C] buffer.
        weight: [O, C/groups, K] float16 or float32 (bfloat16 accepted); used at its stored values (upcast
            exactly; in precision "fp16" the tensor-core path rounds float32 weights to float16, while
            depthwise and few-channel-per-group convs use them as they are).
        bias: optional [O] added before the activation.
        dilation: spacing between taps (>= 1).
        groups: 1 for dense, C for depthwise banks (O = M*C, output channel c*M + m is filter m of input
            channel c), or any divisor of C and O.
        padding: "causal" (output length L; the value at step t depends on steps t-(K-1)*dilation .. t, with
            zeros before the first step) or "valid" (length L - (K-1)*dilation: no padding).
        activation: None/"none", "relu", "gelu" (exact erf form) or "tanh".
        precision: "fp32" (default; float32-accurate via a 3xTF32 split on tensor cores), or the opt-in
            tensor-core modes "tf32" and "fp16" (10-bit mantissas: unfit for raw price levels, where a 0.05
            move at 100 is below their resolution; fine on normalised returns; "fp16" also holds no
            magnitude past 65,504, so larger x or weights, prices near 70,000 say, become inf or NaN on the
            GPU, while CPU tensors compute in float32 whatever the mode). Depthwise and few-channel-per-group
            convs compute in float32 in every mode.
        out: optional float32 [N, O, L_out] destination with any non-overlapping strides, e.g. the
            ``transpose(1, 2)`` view of a time-major [N, L_out, O] buffer. Without it, the result is
            allocated time-major when ``x`` is a time-major view (channel stride 1) and contiguous otherwise.
        recenter: for raw levels (prices) through zero-sum or near-zero-sum filters, with "fp32": each block
            of outputs computes ``conv(x - v) + v * (sum of taps)`` with ``v`` a level of the channel read at
            the block's first output step (the median of that step and the four taps before it, so two bad
            prints in a row are never the level; causal, and samples not finite count as 0), so
            the float32 rounding scales with the moves within a block's reach instead of with the level or
            its drift. 3-19% more time on the H200 (benchmarks/NOTES.md, "Per-block recentering"); the Triton kernels
            only (the torch path on CPU tensors computes as ``F.conv1d``).
        recenter_from: with ``recenter``, the number of rows at the start of ``x`` that are zero history
            rather than data (the engine's first step passes its history rows this way); levels are never
            read there. Default 0.
        tap_sums: with ``recenter``, float64 [O, C/groups]: the per-filter sums over taps that the level is
            added back with (default: the stored weight's own). Pass the sums of the weights as given
            before rounding them to float16, so that the rounding does not add level x (rounded sum - true
            sum) to every output.
        recenter_fallback: with ``recenter``, optional float32 [C]: each channel's level where a block's
            samples are not finite (a series that starts inside the block; default 0). Pass a level near the
            channel's values (its last value before ``x``, or its first in ``x``), so that on raw prices the
            block where a series starts is centred near its first prints rather than on 0.

    The call is asynchronous on CUDA (the current stream of ``x``'s device) and not differentiable. The first
    call for a new shape class on a GPU tunes the block shapes (several launches into ``out``, a few seconds;
    the winner is cached on disk), so make it before any CUDA graph capture. ``out`` must not share memory
    with ``x``, ``weight`` or ``bias``. Under ``torch.compile`` the call is the custom op
    ``torch.ops.tsconv.conv1d`` (one node of the graph, no graph break; ``out`` is then filled by a copy).

    Raises:
        ShapeError: a shape, dtype, device, stride or option that does not fit.
    """
    if torch.compiler.is_compiling():
        # torch.compile: the call becomes one node of the graph (the tsconv::conv1d op) instead of being
        # traced into the launch plans, the tuner and Triton's launcher
        y = _conv1d_op(x, weight, bias, dilation, groups, padding, activation, precision, recenter,
                       recenter_from, tap_sums, recenter_fallback)  # fmt: skip
        return y if out is None else out.copy_(y)
    options = (dilation, groups, padding, activation, precision, recenter, recenter_from)
    key = _plan_key(x, weight, bias, out, options, tap_sums, recenter_fallback)
    if key is not None:
        y = _planned(key, x, weight, bias, out, tap_sums, recenter_fallback)
        if y is not None:
            return y
    spec = validate(
        x,
        weight,
        bias,
        out,
        dilation=dilation,
        groups=groups,
        padding=padding,
        activation=activation,
        precision=precision,
        recenter=recenter,
        recenter_from=recenter_from,
    )
    check_tap_sums(tap_sums, weight, spec)
    check_fallback(recenter_fallback, x, spec)
    if out is None:
        out = _allocate_out(x, spec)
    if out.numel() == 0:
        return out
    f = recenter_fallback
    with torch.no_grad():
        if x.is_cuda:
            if key is not None:  # x is on the current device (_plan_key)
                _conv1d_triton(x, weight, bias, out, spec, plan_key=key, tap_sums=tap_sums, fallback=f)
            else:
                with torch.cuda.device(x.device):  # Triton launches on the current device and stream
                    _conv1d_triton(x, weight, bias, out, spec, tap_sums=tap_sums, fallback=f)
        elif torch_side.INTERPRETED:
            _conv1d_triton(x, weight, bias, out, spec, plan_key=key, tap_sums=tap_sums, fallback=f)
        else:
            _conv1d_torch(x, weight, bias, out, spec)
    return out


# --------------------------------------------------------------------------------------------------------
# the custom op: what torch.compile sees (conv1d routes to it while compiling)
# --------------------------------------------------------------------------------------------------------


@custom_op("tsconv::conv1d", __name__)
def _conv1d_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    groups: int,
    padding: str,
    activation: str | None,
    precision: str,
    recenter: bool,
    recenter_from: int,
    tap_sums: torch.Tensor | None,
    recenter_fallback: torch.Tensor | None,
) -> torch.Tensor:
    """``torch.ops.tsconv.conv1d``: :func:`conv1d` without ``out`` (an op that returns a new tensor)."""
    return conv1d(x, weight, bias, dilation=dilation, groups=groups, padding=padding, activation=activation,
                  precision=precision, recenter=recenter, recenter_from=recenter_from, tap_sums=tap_sums,
                  recenter_fallback=recenter_fallback)  # fmt: skip


@_conv1d_op.register_fake
def _conv1d_fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dilation: int,
    groups: int,
    padding: str,
    activation: str | None,
    precision: str,
    recenter: bool,
    recenter_from: int,
    tap_sums: torch.Tensor | None,
    recenter_fallback: torch.Tensor | None,
) -> torch.Tensor:
    # the same checks (so a misfit fails while tracing, with conv1d's message) and the same layout as a real call
    spec = validate(x, weight, bias, None, dilation=dilation, groups=groups, padding=padding,
                    activation=activation, precision=precision, recenter=recenter, recenter_from=recenter_from)  # fmt: skip
    check_tap_sums(tap_sums, weight, spec)
    check_fallback(recenter_fallback, x, spec)
    return _allocate_out(x, spec)


def _allocate_out(x: torch.Tensor, spec: ConvSpec) -> torch.Tensor:
    """The result's buffer: time-major when x is a time-major view (the engine's layout), else contiguous."""
    if x.stride(1) == 1 and x.stride(2) != 1 and spec.O > 1:
        return torch.empty((spec.N, spec.L_out, spec.O), dtype=torch.float32, device=x.device).transpose(1, 2)
    return torch.empty((spec.N, spec.O, spec.L_out), dtype=torch.float32, device=x.device)


def _conv1d_torch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, spec: ConvSpec
) -> None:
    """CPU tensors without the interpreter: F.conv1d in float32 on the weights' stored values.

    Causal taps that reach back L steps or more read only the zero padding, at every output: they are left
    out, so the padding is at most L - 1 steps, not (K - 1) * dilation (a dilation far above L allocated its
    padding in full: dilation 10**9 was killed for memory where the kernels return at once). Their products
    0 * w are kept where they are not 0: a tap that is not finite makes its filter's outputs NaN, as before
    and as the kernels give. No input channels (C = 0): every output is its bias, as the kernels and gemm's
    K = 0 give (F.conv1d raises on an empty weight)."""
    if spec.C == 0:
        y = torch.zeros((spec.N, spec.O, spec.L_out), dtype=torch.float32, device=x.device)
        out.copy_(apply_activation(y if bias is None else y + bias.float()[:, None], _ACT_NAME[spec.act]))
        return
    xf = x.float()
    w = weight.float()
    skipped = None
    if spec.causal and spec.K > 1:
        keep = min(spec.K, (spec.L - 1) // spec.dilation + 1)  # L >= 1: an empty result returned before
        skipped, w = w[:, :, : spec.K - keep], w[:, :, spec.K - keep :]
        xf = F.pad(xf, ((keep - 1) * spec.dilation, 0))
    b = None if bias is None else bias.float()
    y = F.conv1d(xf, w, b, dilation=spec.dilation, groups=spec.groups)
    if skipped is not None and skipped.numel() > 0:
        y[:, ~skipped.isfinite().flatten(1).all(dim=1)] = float("nan")
    out.copy_(apply_activation(y, _ACT_NAME[spec.act]))


def _uses_gemm(Cg: int, Og: int) -> bool:
    """Tensor cores need at least 16 reduction and 16 output channels per group to pay off."""
    return Cg >= 16 and Og >= 16


@functools.cache
def _launchers() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """The kernel families' launch_dense, launch_direct and replay, imported at the first call that runs one:
    they import Triton, which a CPU run may lack. Cached: an import statement per call cost 2 us on the VM,
    a tenth of a planned launch."""
    from tsconv.kernels.conv1d.dense import launch_dense, replay
    from tsconv.kernels.conv1d.direct import launch_direct

    return launch_dense, launch_direct, replay


def _conv1d_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    spec: ConvSpec,
    *,
    config: autotune.Config | None = None,
    plan_key: tuple | None = None,
    tap_sums: torch.Tensor | None = None,
    fallback: torch.Tensor | None = None,
) -> object:
    """Run the Triton path; ``config`` (tests only) bypasses the tuner and fixes the block shapes.
    ``plan_key``: record the launch as a plan under this key (see :func:`_planned`).

    Returns what the last kernel launch returned (on a GPU the compiled kernel, whose ``asm`` holds its IR).
    """
    launch_dense, launch_direct, _ = _launchers()
    Cg, Og = spec.C // spec.groups, spec.O // spec.groups
    b = None if bias is None else bias.contiguous()
    if _uses_gemm(Cg, Og):
        return launch_dense(
            x, weight, b, out, spec, config, plan_key=plan_key, tap_sums=tap_sums, fallback=fallback
        )
    return launch_direct(
        x, weight, b, out, spec, config, plan_key=plan_key, tap_sums=tap_sums, fallback=fallback
    )


# --------------------------------------------------------------------------------------------------------
# launch plans: the repeated call's short path (tsconv.kernels.launch, tsconv.kernels.conv1d.state)
# --------------------------------------------------------------------------------------------------------


def _plan_key(
    x: object,
    weight: object,
    bias: object,
    out: object,
    options: tuple,
    tap_sums: object = None,
    fallback: object = None,
) -> tuple | None:
    """Everything validation, the tuner's key and the kernels' specialization read from a call, or None (no
    plan: plans off, x not a plain tensor on the current CUDA device or interpreted on the CPU).

    Equal keys pass or fail the same checks, except the pointer-dependent overlap of ``out`` with the inputs
    that :func:`_planned` repeats. Option values are keyed with their types, so ``dilation=True`` does not
    share ``dilation=1``'s plan (validation refuses it)."""
    if not _PLANS_ENABLED or type(x) is not torch.Tensor or not isinstance(weight, torch.Tensor):
        return None
    if not (x.is_cuda or (torch_side.INTERPRETED and x.device.type == "cpu")):
        return None
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        return None
    return (
        tensor_key(x),
        tensor_key(weight),
        tensor_key(bias) if isinstance(bias, torch.Tensor) else bias is None,
        tensor_key(out) if isinstance(out, torch.Tensor) else out is None,
        tuple((type(v), v) for v in options),
        tensor_key(tap_sums) if isinstance(tap_sums, torch.Tensor) else tap_sums is None,
        tensor_key(fallback) if isinstance(fallback, torch.Tensor) else fallback is None,
        # the switches the launchers read (tests set them)
        (state.A_SPLIT, state.FLUSH, state.ROUND_X_TF32, state.FORCE_INDEX64),
    )


def _planned(
    key: tuple,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    tap_sums: torch.Tensor | None = None,
    fallback: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Replay the launch recorded under ``key`` with this call's tensors; None when there is none, or when
    ``out`` overlaps an input (the full path raises the error)."""
    entry = state.PLANS.get(key)
    if entry is None:
        return None
    spec = entry.spec
    if out is None:
        out = _allocate_out(x, spec)
    else:
        e_out, e_x, e_w, e_b = entry.extents
        o = out.data_ptr()
        if overlaps(o, e_out, x, e_x) or overlaps(o, e_out, weight, e_w) or overlaps(o, e_out, bias, e_b):
            return None
    with torch.no_grad():
        if entry.pack is not None:  # direct, bank, window: (x, packed weights, bias, tap sums, fallback, out)
            wp = entry.pack(weight)
            sums = recenter_sums(weight, tap_sums) if spec.recenter else wp
            f = sums if fallback is None else fallback
            entry.plan.launch((x, wp, wp if bias is None else bias.contiguous(), sums, f, out))
        else:
            _launchers()[2](entry, x, weight, bias, out, tap_sums, fallback)  # the dense family's replay
    state.last_launch.update(path=entry.path, config=entry.config)
    return out
