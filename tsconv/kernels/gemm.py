"""Dense GEMM with a fused bias + activation epilogue, as a Triton kernel: the feature pipeline's head.

``gemm(a, b, bias)`` computes ``act(a @ b + bias)`` for ``a`` [M, K] (float32; float16 / bfloat16 accepted)
read through any strides and ``b`` [K, N] stored in float16 (float32 / bfloat16 accepted), accumulating in
float32 and writing a float32 [M, N] result through any strides (``out=`` may be a transposed view).

Precision modes (accumulation is always float32):

- ``"fp32"`` (default): float32-accurate on TF32 tensor cores. Each float32 ``a`` tile is split in registers
  into three TF32-exact parts, ``hi = tf32(a)``, ``mid = tf32(a - hi)``, ``lo = a - hi - mid`` (at most 3
  significant bits), so the tensor core's truncation of its operands to TF32 loses nothing. float16 /
  bfloat16 ``b`` is exact in TF32: three exact products ``lo*b, mid*b, hi*b``. float32 ``b`` is split once
  per call into ``b_hi + b_lo`` (both TF32) and five products are kept: (lo, b_hi), (mid, b_lo), (mid, b_hi),
  (hi, b_lo), (hi, b_hi) (the dropped ones are below float32 rounding). Products are added smallest first,
  and (``_FLUSH``) the products of one K block are summed in a fresh tensor-core accumulator that is then
  added to the running sum on the CUDA cores with round-to-nearest: the tensor core's round-toward-zero
  accumulation never acts on the long running sum (its error would grow linearly with K, not like sqrt(K)).
  A two-way split ``a_hi + (a - a_hi)`` is not enough: the remainder has 13 significant bits, which the
  tensor core truncates to 10 (errors 5-20x cuBLAS fp32 on price-level data on an H200).
- ``"tf32"``: one TF32 product; ``b`` rounded to the nearest TF32 when packed, float32 ``a`` rounded to TF32
  (ties to even) before the tensor core, which would otherwise truncate it (twice the error; cuBLAS with
  TF32 allowed rounds too). Where: with more than one column block (wide heads, compute-bound) each ``a``
  value is loaded once per column block, so a memory-bound pre-pass writes a rounded float32 copy (one read
  and one write of ``a``, about 6% at 4096^3) and the kernel feeds both tiles to the tensor cores straight
  from shared memory, as before; with one column block (narrow heads, memory-bound on reading ``a``) each
  value is loaded once, so the kernel rounds it in registers (``ROUND_A``, see ``_round_a_in_kernel``)
  instead of tripling the traffic on ``a``. The two give identical operands. On Hopper, for the wide
  spaces, ``_gemm_tma_kernel`` loads both tiles by TMA descriptors whose element type makes the copy engine
  round float32 ``a`` to TF32 on its way to shared memory (``tsconv.kernels.tma``): no pre-pass, both
  wgmma operands from shared memory (4096^3: 0.51 -> 0.38 ms on the H200). 10-bit mantissas: opt-in.
- ``"fp16"``: ``a`` rounded to float16 (in the kernel, or by a cast pass before it when the tuner finds that
  faster for compute-bound shapes), ``b`` in float16. Opt-in.

Operand layouts: for the TF32 modes ``b`` is rearranged to [N, K] float32, contiguous along the reduction
(Hopper's TF32 wgmma takes only K-major shared-memory tiles; a [K, N] tile would be transposed through
registers on every step); :func:`pack_weights` does that once, and plain-tensor weights are packed on first
use and cached (keyed by storage and version counter), so a steady-state call launches one kernel.
"fp16" reads float16 ``b`` in place (16-bit wgmma accepts either major order).

On CUDA tensors the kernel runs with block shapes tuned per GPU and shape class and cached on disk
(:mod:`tsconv.kernels.autotune`; spaces defined here). On CPU tensors it runs through the Triton interpreter
when ``TRITON_INTERPRET=1`` was set before this module was imported; otherwise CPU tensors take a torch path
(float32 matmul of the stored values) with the same semantics.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tsconv.errors import ShapeError
from tsconv.kernels import autotune, tma, torch_side
from tsconv.kernels.checks import ACT_CODE as _ACT_CODE
from tsconv.kernels.checks import ACT_NAME as _ACT_NAME
from tsconv.kernels.checks import INT32_MAX as _INT32_MAX
from tsconv.kernels.checks import PREC_CODE as _PREC_CODE
from tsconv.kernels.checks import check_out, is_activation
from tsconv.kernels.checks import describe as _shape
from tsconv.kernels.checks import dtype_name as _dtype_name
from tsconv.kernels.common import activate, dot_split, grouped, round_tf32_into, round_tf32_rne, tf32_buffer
from tsconv.kernels.launch import (
    LaunchPlan,
    PlanCache,
    extent,
    launch_recorded,
    overlaps,
    tensor_key,
)
from tsconv.kernels.torch_side import apply_activation, custom_op, round_tf32_torch
from tsconv.kernels.weight_cache import WeightCache, writes_out

__all__ = [
    "ACTIVATIONS",
    "PRECISIONS",
    "PackedWeights",
    "clear_weight_cache",
    "gemm",
    "gemm_space",
    "pack_weights",
]

ACTIVATIONS = (None, "none", "relu", "gelu", "tanh")
PRECISIONS = ("fp32", "tf32", "fp16")

_A_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_B_DTYPES = (torch.float16, torch.float32, torch.bfloat16)

# Module switches (tests flip them to show what each one is for).
_FLUSH = True  # fp32 mode: per-K-block fresh tensor-core accumulator, added to the running sum with RN
_A_SPLIT = 3  # fp32 mode, float32 a: 3 = hi + mid + lo (exact in TF32); 2 = hi + 13-bit remainder (old)
_ROUND_A_TF32 = True  # tf32 mode, float32 a: rounded to TF32 (ties to even); False: truncated by the TC (old)
# Which config the last Triton launch used (benchmarks report it): {"config": ...}.
last_launch: dict[str, str] = {}


# --------------------------------------------------------------------------------------------------------
# kernel
# --------------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(
    a_ptr,
    b_ptr,
    blo_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    PREC: tl.constexpr,
    A_SPLIT: tl.constexpr,
    W_SPLIT: tl.constexpr,
    FLUSH: tl.constexpr,
    ROUND_A: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Grouped ordering (common.grouped): GROUP_M row blocks sweep all column blocks together, so the a rows
    # and b columns a wave of programs touches stay in L2.
    pid_m, pid_n = grouped(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # 64-bit row/column offsets: M * stride can pass 2**31 for long heads; the K steps stay 32-bit increments.
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_off = offs_k[:, None] * stride_bk + offs_n.to(tl.int64)[None, :] * stride_bn
    b_ptrs = b_ptr + b_off
    blo_ptrs = blo_ptr + b_off

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=m_mask[:, None] & k_ok[None, :], other=0.0)
        b_mask = k_ok[:, None] & n_mask[None, :]
        b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        if PREC == 0:
            if W_SPLIT:
                b_lo = tl.load(blo_ptrs, mask=b_mask, other=0.0)
            else:
                b_lo = b
            acc = dot_split(a.to(tl.float32), b, b_lo, acc, A_SPLIT, W_SPLIT, FLUSH)
        elif PREC == 1:
            if ROUND_A:  # one column block: each a value is loaded once, rounding it here adds no traffic
                acc = tl.dot(round_tf32_rne(a.to(tl.float32)), b, acc, input_precision="tf32")
            else:  # a as loaded (already rounded by the launcher's pre-pass, or exact float16 / bfloat16)
                acc = tl.dot(a.to(tl.float32), b, acc, input_precision="tf32")
        else:
            acc = tl.dot(a.to(tl.float16), b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
        blo_ptrs += BLOCK_K * stride_bk

    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    acc = activate(acc, ACT)
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["M"])
def _gemm_tma_kernel(
    a_desc,
    b_desc,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    PREC: tl.constexpr,
    B_NK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """The "tf32" / "fp16" product with both operands loaded by the TMA (Hopper): tiles land in shared memory
    and go to wgmma from there, edges zero-filled by the copy engine (no masks in the loop). For "tf32" the
    descriptor of float32 ``a`` rounds it to TF32 on the way (``tsconv.kernels.tma``); ``B_NK``: ``b`` is
    the packed [N, K] (TF32 modes), else [K, N] float16."""
    pid_m, pid_n = grouped(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([off_m, k0])
        if B_NK:
            b = b_desc.load([off_n, k0]).T
        else:
            b = b_desc.load([k0, off_n])
        if PREC == 1:
            acc = tl.dot(a, b, acc, input_precision="tf32")
        else:
            acc = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)

    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    acc = activate(acc, ACT)
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=(offs_m < M)[:, None] & n_mask[None, :])


# --------------------------------------------------------------------------------------------------------
# config spaces
# --------------------------------------------------------------------------------------------------------


def _cfg(
    bm: int, bn: int, bk: int, warps: int, stages: int, group: int = 8, a16: int = 0, tma: int = 0
) -> autotune.Config:
    meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group}
    name = f"m{bm}_n{bn}_k{bk}_w{warps}_s{stages}_g{group}"
    if a16:
        meta["A16"] = 1  # launcher-level: cast a to float16 in a pass before the kernel ("fp16" only)
        name += "_a16"
    if tma:
        meta["TMA"] = 1  # launcher-level: _gemm_tma_kernel (Hopper; operands that fit a TMA descriptor)
        name += "_tma"
    return autotune.Config(name, meta, num_warps=warps, num_stages=stages)


def _clamp(cfgs: list[autotune.Config], M: int, N: int, K: int) -> list[autotune.Config]:
    """Shrink blocks to the problem (at least 16, tl.dot's minimum) and drop duplicates."""
    max_m, max_n, max_k = (max(16, autotune.pow2_bucket(v)) for v in (M, N, K))
    out: list[autotune.Config] = []
    for c in cfgs:
        m = c.meta
        new = _cfg(
            min(m["BLOCK_M"], max_m),
            min(m["BLOCK_N"], max_n),
            min(m["BLOCK_K"], max_k),
            c.num_warps,
            c.num_stages,
            m["GROUP_M"],
            m.get("A16", 0),
            m.get("TMA", 0),
        )
        if all(o.name != new.name for o in out):
            out.append(new)
    return out


def gemm_space(precision: str, M: int, N: int, K: int, *, tma: bool = False) -> autotune.ConfigSpace:
    """Candidate tiles for one precision and shape class (built once per size bucket, then cached).

    Classes: "narrow" heads (N <= 64: memory-bound on reading ``a``, so a tall BLOCK_M, BLOCK_N = N rounded
    up to 16..64, and deep pipelines to keep bytes in flight) and "wide" (square-ish, compute-bound: the
    classic 128x128 / 128x256 tiles with grouped ordering). Shared memory per stage: 4-byte ``a`` and ``b``
    in the TF32 modes (BLOCK_K 32 keeps a 128x128 stage at 32 KiB); "fp16" loads float32 ``a`` (4 bytes) and
    float16 ``b``, or float16 ``a`` when the A16 candidates cast it first. The "fp32" mode holds a second
    accumulator (the per-block flush), so its tiles stay at 128x128 outputs per 8 warps.
    ``tma``: the operands fit TMA descriptors on a Hopper GPU (``_tma_ok``): the wide "tf32" / "fp16" spaces
    then add candidates for ``_gemm_tma_kernel``.
    """
    pb = autotune.pow2_bucket
    return _space(precision, max(16, pb(M)), max(16, pb(N)), max(16, pb(K)), tma)


@functools.lru_cache(maxsize=256)
def _space(precision: str, M: int, N: int, K: int, tma: bool = False) -> autotune.ConfigSpace:
    # M, N, K are bucketed (powers of two >= 16): _clamp and the narrow test depend only on the bucket.
    narrow = N <= 64
    if narrow:
        # Memory-bound on reading a: deep K blocks (few loop trips, many bytes in flight per program), 2-3
        # programs per SM. "fp32" splits the a tile in registers (hi / mid / lo), so it keeps <= 32 a values
        # per thread (BLOCK_M * BLOCK_K / threads) to stay clear of spills; "tf32" rounds the a tile in
        # registers (one column block) where it holds <= 64 values per thread, else pre-rounds a in a pass
        # and feeds both tiles from shared memory (``_round_a_in_kernel``).
        bn = 64
        if precision == "fp16":
            cfgs = [
                _cfg(128, bn, 64, 4, 4),
                _cfg(128, bn, 128, 4, 2),
                _cfg(256, bn, 64, 8, 3),
                _cfg(64, bn, 128, 4, 3),
                _cfg(128, bn, 64, 4, 3),
                _cfg(64, bn, 64, 4, 4),
            ]
        elif precision == "tf32":
            cfgs = [
                _cfg(128, bn, 64, 4, 4),
                _cfg(128, bn, 128, 4, 2),
                _cfg(64, bn, 128, 4, 3),
                _cfg(128, bn, 64, 4, 3),
                _cfg(256, bn, 64, 8, 2),
                _cfg(64, bn, 64, 4, 4),
            ]
        else:
            cfgs = [  # 128 x 64 per 4 warps (the old default) spills under the split: not offered
                _cfg(128, bn, 64, 8, 3),
                _cfg(64, bn, 64, 4, 4),
                _cfg(64, bn, 32, 4, 6),
                _cfg(128, bn, 32, 8, 4),
                _cfg(64, bn, 64, 4, 3),
            ]
    elif precision == "fp32":
        # 128 x 128 per 4 warps, 128 x 256 and 256 x 128 per 8 warps spill 1-2 KB under the split (ptxas,
        # sm_90): not offered.
        cfgs = [
            _cfg(128, 128, 32, 8, 3),
            _cfg(128, 128, 32, 8, 4),
            _cfg(64, 128, 32, 4, 4),
            _cfg(128, 64, 32, 8, 4),
            _cfg(64, 128, 32, 4, 3),
        ]
    elif precision == "tf32":
        cfgs = [
            _cfg(128, 256, 32, 8, 4),
            _cfg(128, 256, 32, 8, 3),
            _cfg(256, 128, 32, 8, 4),
            _cfg(128, 256, 16, 8, 6),
            _cfg(128, 128, 32, 8, 5),
            _cfg(128, 128, 32, 4, 4),
            _cfg(128, 128, 64, 8, 3),
            _cfg(64, 256, 32, 4, 4),
        ]
    else:
        cfgs = [
            _cfg(128, 256, 64, 8, 3),
            _cfg(128, 256, 32, 8, 5),
            _cfg(128, 128, 64, 8, 4),
            _cfg(128, 128, 64, 4, 4),
            _cfg(256, 128, 64, 8, 2),
            _cfg(128, 256, 64, 8, 3, a16=1),
            _cfg(128, 256, 64, 8, 4, a16=1),
            _cfg(256, 128, 64, 8, 3, a16=1),
        ]
    if tma and not narrow and precision == "tf32":
        # TMA loads (a rounded to TF32 by the copy engine): both wgmma operands from shared memory, no pre-pass.
        cfgs += [
            _cfg(128, 256, 32, 8, 4, tma=1),
            _cfg(128, 256, 32, 8, 3, tma=1),
            _cfg(128, 128, 32, 8, 5, tma=1),
            _cfg(128, 128, 32, 4, 4, tma=1),
            _cfg(256, 128, 32, 8, 4, tma=1),
        ]
    elif tma and not narrow and precision == "fp16":
        cfgs += [
            _cfg(128, 256, 64, 8, 3, tma=1),
            _cfg(128, 256, 64, 8, 4, a16=1, tma=1),
            _cfg(128, 256, 64, 8, 3, a16=1, tma=1),
            _cfg(128, 128, 64, 8, 4, a16=1, tma=1),
            _cfg(128, 256, 32, 8, 4, tma=1),
        ]
    cfgs = _clamp(cfgs, M, N, K)
    interp = _clamp([_cfg(64, 64, 32, 4, 1)], M, N, K)[0]
    name = f"gemm_{'narrow' if narrow else 'wide'}_{precision}{'_tma' if tma and not narrow else ''}"
    return autotune.ConfigSpace(name, tuple(cfgs), cfgs[0], interp)


# --------------------------------------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class PackedWeights:
    """``b`` [K, N] rearranged for one precision mode (see :func:`pack_weights`); pass it to :func:`gemm`.

    ``hi`` / ``lo`` are the kernel's operands: for "fp32" / "tf32" [N, K] float32 views (K contiguous) of the
    TF32 high part and (float32 ``b`` in "fp32" only) the TF32 low part; for "fp16" the float16 [K, N] values.
    ``source`` is the original ``b`` (the CPU torch path and validation use it).
    """

    precision: str
    source: torch.Tensor
    hi: torch.Tensor
    lo: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.source.shape[0]), int(self.source.shape[1]))

    def kernel_strides(self) -> tuple[int, int]:
        """(stride along K, stride along N) of ``hi`` / ``lo``."""
        if self.precision == "fp16":
            return self.hi.stride(0), self.hi.stride(1)
        return self.hi.stride(1), self.hi.stride(0)


def _pack(b: torch.Tensor, precision: str) -> PackedWeights:
    K, N = b.shape
    if precision == "fp16":
        return PackedWeights(precision, b, b if b.dtype == torch.float16 else b.half(), None)
    k_pad = -(-max(K, 1) // 16) * 16  # rows 64-byte aligned: vector loads whatever K is
    buf = torch.empty((N, k_pad), dtype=torch.float32, device=b.device)
    bt = buf[:, :K]
    bt.copy_(b.t())
    hi_buf = round_tf32_torch(buf)  # exact for float16 / bfloat16 b
    hi = hi_buf[:, :K]
    lo = None
    if precision == "fp32" and b.dtype == torch.float32:
        lo = round_tf32_torch(buf - hi_buf)[:, :K]
    return PackedWeights(precision, b, hi, lo)


# Packed copies of weights passed as plain tensors, so that a steady-state call with the same weights runs
# one kernel and no packing passes (``tsconv.kernels.weight_cache``). Writes that bypass autograd's version
# counter are not seen: pass a :class:`PackedWeights` or call :func:`clear_weight_cache` after such writes.
_PACK_CACHE = WeightCache(16)


def clear_weight_cache() -> None:
    """Forget the packed copies of weights that :func:`gemm` keeps for plain-tensor ``b``."""
    _PACK_CACHE.clear()


def _pack_cached(b: torch.Tensor, precision: str) -> PackedWeights:
    if precision == "fp16" and b.dtype == torch.float16:
        return PackedWeights(precision, b, b, None)  # read in place: nothing to pack
    return _PACK_CACHE.get(b, precision, lambda w: _pack(w, precision))


def pack_weights(b: torch.Tensor, precision: str = "fp32") -> PackedWeights:
    """Rearrange ``b`` [K, N] once for :func:`gemm` in ``precision`` (the work every call would do).

    Useful for weights reused over many calls (a pipeline head): on a 4096 x 4096 ``b`` it saves a
    transpose-and-convert pass of about 100 MB per call. ``b`` must not change afterwards (the packed copy
    would not follow); the CPU paths use ``b`` itself.
    """
    _check_b(b)
    _check_precision(precision)
    return _pack(b, precision)


# --------------------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spec:
    M: int
    K: int
    N: int
    act: int
    precision: str


def _check_b(b: object) -> None:
    if not isinstance(b, torch.Tensor):
        msg = f"b must be a torch.Tensor or PackedWeights, got {type(b).__name__}."
        raise ShapeError(msg, hint="pass a [K, N] float16 tensor.")
    if b.dim() != 2:
        msg = f"b must be [K, N] (2 dims), got shape {_shape(b)}."
        raise ShapeError(msg, hint="a head's weight is [features in, features out]; use w.T for [out, in].")
    if b.dtype not in _B_DTYPES:
        msg = f"b must be float16 or float32 (or bfloat16), got {b.dtype}."
        raise ShapeError(msg, hint="store head weights as float16 or float32.")
    if b.device.type not in ("cuda", "cpu"):
        msg = f"b must be on a CUDA device or the CPU, got {b.device}."
        raise ShapeError(msg, hint="move it with b.cuda() or b.cpu().")


def _check_precision(precision: object) -> None:
    if precision not in PRECISIONS:
        msg = f"precision must be 'fp32', 'tf32' or 'fp16', got {precision!r}."
        raise ShapeError(msg, hint="'fp32' is the default and the only mode fit for raw price levels.")


def _validate(
    a: object, b: object, bias: object, out: object, activation: object, precision: object
) -> _Spec:
    if not isinstance(a, torch.Tensor):
        raise ShapeError(f"a must be a torch.Tensor, got {type(a).__name__}.", hint="pass a [M, K] tensor.")
    if a.dim() != 2:
        msg = f"a must be [M, K] (2 dims), got shape {_shape(a)}."
        raise ShapeError(msg, hint="flatten leading dims first: a.reshape(-1, a.shape[-1]).")
    if a.dtype not in _A_DTYPES:
        msg = f"a must be float32 (or float16 / bfloat16), got {a.dtype}."
        raise ShapeError(msg, hint="convert with a.float().")
    if a.device.type not in ("cuda", "cpu"):
        msg = f"a must be on a CUDA device or the CPU, got {a.device}."
        raise ShapeError(msg, hint="move it with a.cuda() or a.cpu().")
    _check_precision(precision)
    if isinstance(b, PackedWeights):
        if b.precision != precision:
            msg = f"b was packed for precision {b.precision!r} but the call asks for {precision!r}."
            raise ShapeError(msg, hint=f"pack with pack_weights(b, {precision!r}) or pass b itself.")
        src = b.source
    else:
        _check_b(b)
        src = b
    if src.device != a.device:
        msg = f"b is on {src.device} but a is on {a.device}."
        raise ShapeError(msg, hint="move the weights to a's device with b.to(a.device).")
    M, K = a.shape
    Kb, N = src.shape
    if Kb != K:
        msg = f"b must be [K, N] with K = {K} (the columns of a {_shape(a)}), got {_shape(src)}."
        raise ShapeError(msg, hint="a [N, K] weight (torch.nn.Linear layout) is passed as w.T.")
    if not is_activation(activation):
        msg = f"activation must be one of None, 'none', 'relu', 'gelu', 'tanh', got {activation!r}."
        raise ShapeError(msg, hint="use activation=None for a plain product.")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise ShapeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}.", hint="[N].")
        if bias.dim() != 1 or bias.shape[0] != N:
            raise ShapeError(f"bias must be [N] = [{N}], got {_shape(bias)}.", hint="one bias per output.")
        if bias.dtype not in _B_DTYPES:
            raise ShapeError(f"bias must be a float tensor, got {bias.dtype}.", hint="use bias.float().")
        if bias.device != a.device:
            raise ShapeError(f"bias is on {bias.device} but a is on {a.device}.", hint="bias.to(a.device).")
    if out is not None:
        check_out(
            out,
            shape=(M, N),
            expected=f"[M, N] = {(M, N)}",
            shape_hint="for a transposed [N, M] buffer pass buf.T.",
            view_example="buf.T",
            owner=("a", a),
            inputs={"a": a, "b": src, "bias": bias},
        )
    return _Spec(int(M), int(K), int(N), _ACT_CODE[activation], str(precision))


# --------------------------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------------------------


@writes_out
def gemm(
    a: torch.Tensor,
    b: torch.Tensor | PackedWeights,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    precision: str = "fp32",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act(a @ b + bias)`` with float32 accumulation; returns the float32 [M, N] result.

    Args:
        a: [M, K] float32 (float16 / bfloat16 accepted) with any strides (e.g. a transposed view).
        b: [K, N] float16 (float32 / bfloat16 accepted), used at its stored values; or a
            :class:`PackedWeights` from :func:`pack_weights` with the same ``precision``.
        bias: optional [N] added before the activation.
        activation: None/"none", "relu", "gelu" (exact erf form) or "tanh".
        precision: "fp32" (default; float32-accurate via a three-way TF32 split on tensor cores), or the
            opt-in tensor-core modes "tf32" and "fp16" (10-bit mantissas: unfit for raw price levels).
        out: optional float32 [M, N] destination with any non-overlapping strides (e.g. ``buf.T``); it
            must not share memory with ``a``, ``b`` or ``bias``.

    The call is asynchronous on CUDA (current stream of ``a``'s device) and not differentiable. The first
    call of a shape class on a GPU tunes the tiles (several launches into ``out``; the winner is cached on
    disk), so make it before any CUDA graph capture.

    Raises:
        ShapeError: a shape, dtype, device, stride or option that does not fit.

    Under ``torch.compile`` the call is the custom op ``torch.ops.tsconv.gemm`` (one node of the graph; a
    :class:`PackedWeights` ``b`` passes its source, and ``out`` is filled by a copy).
    """
    if torch.compiler.is_compiling():
        # one graph node instead of a trace into the launch plans, the tuner and Triton's launcher
        src = b.source if isinstance(b, PackedWeights) else b
        if isinstance(b, PackedWeights):
            _validate(a, b, bias, None, activation, precision)  # a mismatched packing fails as in eager
        y = _gemm_op(a, src, bias, activation, precision)
        return y if out is None else out.copy_(y)
    key = _plan_key(a, b, bias, out, activation, precision)
    if key is not None:
        y = _planned(key, a, b, bias, out, precision)
        if y is not None:
            return y
    spec = _validate(a, b, bias, out, activation, precision)
    if out is None:
        out = torch.empty((spec.M, spec.N), dtype=torch.float32, device=a.device)
    if out.numel() == 0:
        return out
    src = b.source if isinstance(b, PackedWeights) else b
    with torch.no_grad():
        if spec.K == 0:
            out.copy_(_epilogue_torch(torch.zeros_like(out), bias, spec))
        elif a.is_cuda:
            if a.device.index == torch.cuda.current_device():
                _gemm_triton(a, b, bias, out, spec, plan_key=key)
            else:
                with torch.cuda.device(a.device):  # Triton launches on the current device and stream
                    _gemm_triton(a, b, bias, out, spec)
        elif torch_side.INTERPRETED:
            _gemm_triton(a, b, bias, out, spec, plan_key=key)
        else:
            out.copy_(_epilogue_torch(a.float() @ src.float(), bias, spec))
    return out


@custom_op("tsconv::gemm", __name__)
def _gemm_op(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str | None, precision: str
) -> torch.Tensor:
    """``torch.ops.tsconv.gemm``: :func:`gemm` on a plain ``b`` without ``out``."""
    return gemm(a, b, bias, activation=activation, precision=precision)


@_gemm_op.register_fake
def _gemm_fake(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str | None, precision: str
) -> torch.Tensor:
    _validate(a, b, bias, None, activation, precision)  # a misfit fails while tracing, with gemm's message
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float32)


# --------------------------------------------------------------------------------------------------------
# launch plans: the repeated call's short path
# --------------------------------------------------------------------------------------------------------

# Names of the kernels' tensor parameters, in the order _planned passes them (_gemm_kernel, _gemm_tma_kernel).
_PLAN_SLOTS = ("a_ptr", "b_ptr", "blo_ptr", "bias_ptr", "c_ptr")
_TMA_SLOTS = ("a_desc", "b_desc", "bias_ptr", "c_ptr")
_PREP_NONE, _PREP_A16, _PREP_ROUND = 0, 1, 2  # the pass that makes the kernel's copy of a, if any
_PLANS = PlanCache(64)
autotune.on_clear(_PLANS.clear)  # plans embody the tuner's winners
# False (tests) sends every call through validation, the tuner lookup and kernel[grid].
_PLANS_ENABLED = True


@dataclass(frozen=True)
class _GemmPlan:
    plan: LaunchPlan
    config: str
    M: int
    N: int
    prep: int  # _PREP_*
    tma: tuple | None  # (a block, b block, round_tf32) for _gemm_tma_kernel; None: _gemm_kernel
    # Byte extents of (out, a, b's source, bias) as strided views (0: empty or absent), fixed by the key's
    # layouts: a replay checks out against the inputs with four pointer reads instead of four span sums.
    extents: tuple[int, int, int, int]


def _plan_key(
    a: object, b: object, bias: object, out: object, activation: object, precision: object
) -> tuple | None:
    """Everything a call's validation, tuning key and kernel specialization depend on, or None (no plans).

    Two calls with equal keys pass or fail the same checks (except the pointer-dependent overlap of ``out``
    with the inputs, which :func:`_planned` repeats), choose the same config and specialize the kernel the
    same way (integers, dtypes, 16-byte alignments), so the second can replay the first's launch. A
    :class:`PackedWeights` is keyed by its tensors' layouts, not its identity: the plan takes its tensors
    from the call.
    """
    if not _PLANS_ENABLED or type(a) is not torch.Tensor or not isinstance(b, torch.Tensor | PackedWeights):
        return None
    if not (a.is_cuda or (torch_side.INTERPRETED and a.device.type == "cpu")):
        return None
    if a.is_cuda and a.device.index != torch.cuda.current_device():
        return None
    if isinstance(b, PackedWeights):
        bk = (b.precision, tensor_key(b.source), tensor_key(b.hi), None if b.lo is None else tensor_key(b.lo))
    else:
        bk = (None, tensor_key(b))
    return (
        tensor_key(a),
        bk,
        None if not isinstance(bias, torch.Tensor) else tensor_key(bias),
        bias is None,
        None if not isinstance(out, torch.Tensor) else tensor_key(out),
        out is None,
        activation,
        precision,
        (_A_SPLIT, _FLUSH, _ROUND_A_TF32),  # module knobs the launch reads (tests change them)
    )


def _planned(
    key: tuple, a: torch.Tensor, b: torch.Tensor | PackedWeights, bias, out, precision: str
) -> torch.Tensor | None:
    """Replay the launch recorded under ``key``; None when there is none (the caller takes the full path).
    A hit means the call's ``precision`` was validated when the plan was recorded."""
    entry = _PLANS.get(key)
    if entry is None:
        return None
    # A re-packed copy (b written in place since the plan) has the recorded layout: fresh buffers, aligned.
    packed = b if isinstance(b, PackedWeights) else _pack_cached(b, precision)
    src = packed.source
    if out is None:
        out = torch.empty((entry.M, entry.N), dtype=torch.float32, device=a.device)
    else:
        e_out, e_a, e_src, e_bias = entry.extents
        o = out.data_ptr()
        if overlaps(o, e_out, a, e_a) or overlaps(o, e_out, src, e_src) or overlaps(o, e_out, bias, e_bias):
            return None  # the full path raises the error
    hi = packed.hi
    bias_c = hi if bias is None else bias.contiguous()
    with torch.no_grad():
        a_k = a
        if entry.prep == _PREP_A16:
            a_k = _a16_buffer(a, a.shape[1])
            a_k.copy_(a)
        elif entry.prep == _PREP_ROUND:
            a_k = tf32_buffer(a)
            round_tf32_into(a, a_k)
        if entry.tma is not None:
            a_desc, b_desc = _descriptors(a_k, hi, entry.tma)
            entry.plan.launch((a_desc, b_desc, bias_c, out))
        else:
            entry.plan.launch((a_k, hi, hi if packed.lo is None else packed.lo, bias_c, out))
    last_launch["config"] = entry.config
    return out


def _epilogue_torch(y: torch.Tensor, bias: torch.Tensor | None, spec: _Spec) -> torch.Tensor:
    if bias is not None:
        y = y + bias.float()
    return apply_activation(y, _ACT_NAME[spec.act])


# --------------------------------------------------------------------------------------------------------
# Triton launcher
# --------------------------------------------------------------------------------------------------------


def _layout(t: torch.Tensor) -> str:
    """'r' when the last dim is contiguous (row-major), 'c' when the first is (a transposed view), else 's'."""
    if t.stride(1) == 1:
        return "r"
    if t.stride(0) == 1:
        return "c"
    return "s"


def _gemm_triton(
    a: torch.Tensor,
    b: torch.Tensor | PackedWeights,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    spec: _Spec,
    *,
    config: autotune.Config | None = None,
    plan_key: tuple | None = None,
) -> object:
    """Run the Triton kernel; ``config`` (tests only) bypasses the tuner. Returns the last launch's result.

    ``plan_key``: record the launch as a plan under this key (see :func:`_planned`).
    """
    packed = b if isinstance(b, PackedWeights) else _pack_cached(b, spec.precision)
    src = packed.source
    bias_c = None if bias is None else bias.contiguous()
    stride_bk, stride_bn = packed.kernel_strides()
    M, N, K = spec.M, spec.N, spec.K
    meta = {
        "HAS_BIAS": bias_c is not None,
        "ACT": spec.act,
        "PREC": _PREC_CODE[spec.precision],
        "A_SPLIT": _A_SPLIT if a.dtype == torch.float32 else 1,
        "W_SPLIT": packed.lo is not None,
        "FLUSH": _FLUSH,
    }
    round_a = spec.precision == "tf32" and a.dtype == torch.float32 and _ROUND_A_TF32
    cast: dict[str, torch.Tensor] = {}

    recorded: dict[str, object] = {}

    def launch(cfg: autotune.Config) -> object:
        kw = cfg.launch_kwargs()
        a16 = kw.pop("A16", 0) and spec.precision == "fp16" and a.dtype != torch.float16
        use_tma = kw.pop("TMA", 0)
        a_k = a
        prep = _PREP_NONE
        n_cols = triton.cdiv(N, kw["BLOCK_N"])
        kw["ROUND_A"] = round_a and _round_a_in_kernel(n_cols, kw)
        if a16:  # one cast pass, then the kernel reads half the bytes through the plain fp16 pipeline
            if "a" not in cast:
                cast["a"] = _a16_buffer(a, K)
            a_k = cast["a"]
            a_k.copy_(a)
            prep = _PREP_A16
        if use_tma:
            return launch_tma(a_k, kw, prep)
        if round_a and not kw["ROUND_A"] and not a16:  # a rounded copy in a's layout, redone per launch
            if "r" not in cast:
                cast["r"] = tf32_buffer(a)
            a_k = cast["r"]
            round_tf32_into(a, a_k)
            prep = _PREP_ROUND
        grid = (triton.cdiv(M, kw["BLOCK_M"]) * n_cols,)
        _check_grid(grid[0])
        args = {
            "a_ptr": a_k,
            "b_ptr": packed.hi,
            "blo_ptr": packed.hi if packed.lo is None else packed.lo,
            "bias_ptr": packed.hi if bias_c is None else bias_c,
            "c_ptr": out,
            "M": M,
            "N": N,
            "K": K,
            "stride_am": a_k.stride(0),
            "stride_ak": a_k.stride(1),
            "stride_bk": stride_bk,
            "stride_bn": stride_bn,
            "stride_cm": out.stride(0),
            "stride_cn": out.stride(1),
            **meta,
            **kw,
        }
        recorded.update(prep=prep, tma=None)
        return launch_recorded(recorded, _gemm_kernel, grid, (), args)

    def launch_tma(a_k: torch.Tensor, kw: dict[str, int], prep: int) -> object:
        bm, bn, bk = kw.pop("BLOCK_M"), kw.pop("BLOCK_N"), kw.pop("BLOCK_K")
        kw.pop("ROUND_A")
        round_tf32 = spec.precision == "tf32" and a_k.dtype == torch.float32
        b_nk = spec.precision != "fp16"
        blocks = ([bm, bk], [bn, bk] if b_nk else [bk, bn], round_tf32)
        a_desc, b_desc = _descriptors(a_k, packed.hi, blocks)
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        _check_grid(grid[0])
        args = {
            "a_desc": a_desc,
            "b_desc": b_desc,
            "bias_ptr": packed.hi if bias_c is None else bias_c,
            "c_ptr": out,
            "M": M,
            "N": N,
            "K": K,
            "stride_cm": out.stride(0),
            "stride_cn": out.stride(1),
            "HAS_BIAS": bias_c is not None,
            "ACT": spec.act,
            "PREC": _PREC_CODE[spec.precision],
            "B_NK": b_nk,
            "BLOCK_M": bm,
            "BLOCK_N": bn,
            "BLOCK_K": bk,
            **kw,
        }
        recorded.update(prep=prep, tma=blocks)
        return launch_recorded(recorded, _gemm_tma_kernel, grid, (), args)

    if config is None:
        use_tma = _tma_ok(a, packed, spec)
        space = gemm_space(spec.precision, M, N, K, tma=use_tma)
        key = (
            f"{spec.precision}|a={_dtype_name(a)}|b={_dtype_name(src)}|al={_layout(a)}|ol={_layout(out)}"
            f"|M={autotune.pow2_bucket(M)}|N={autotune.pow2_bucket(N)}|K={autotune.pow2_bucket(K)}"
        )
        config = autotune.select(space, key, launch, device=a.device, interpreted=torch_side.INTERPRETED)
    last_launch.update(config=config.name)
    ret = launch(config)
    if plan_key is not None:
        slots = _PLAN_SLOTS if recorded["tma"] is None else _TMA_SLOTS
        plan = LaunchPlan(recorded["fn"], recorded["ret"], recorded["grid"], recorded["args"], slots)
        extents = (extent(out), extent(a), extent(src), extent(bias))
        _PLANS.put(plan_key, _GemmPlan(plan, config.name, M, N, recorded["prep"], recorded["tma"], extents))
    return ret


def _a16_buffer(a: torch.Tensor, K: int) -> torch.Tensor:
    """An uninitialised float16 [M, K] view for the A16 configs' cast of ``a``, rows padded to 16 bytes so
    that a TMA descriptor can read the copy whatever K is."""
    k_pad = -(-K // 8) * 8
    return torch.empty((a.shape[0], k_pad), dtype=torch.float16, device=a.device)[:, :K]


def _descriptors(a_k: torch.Tensor, hi: torch.Tensor, blocks: tuple) -> tuple[object, object]:
    """The TMA kernel's descriptors over ``a`` (or its copy) and the packed weights."""
    a_block, b_block, round_tf32 = blocks
    return tma.descriptor(a_k, a_block, round_tf32=round_tf32), tma.descriptor(hi, b_block)


def _tma_ok(a: torch.Tensor, packed: PackedWeights, spec: _Spec) -> bool:
    """Can ``_gemm_tma_kernel`` run this call? Both operands usable by a TMA kernel (``tma.usable``)."""
    return tma.usable(a, spec.precision) and tma.fits(packed.hi)


def _round_a_in_kernel(n_cols: int, kw: dict[str, int]) -> bool:
    """With "tf32" and float32 ``a``: round ``a`` in the kernel's registers (True) or in a pre-pass (False)?

    In the kernel only with one column block (each ``a`` value loaded once: no extra traffic, where a pre-pass
    would triple the bytes of a memory-bound narrow head) and at most 64 ``a`` values per thread per K block:
    the rounded tile goes to wgmma from registers, and the 128 x 128 per 4 warps narrow tile (128 values per
    thread) spills 532 bytes that way on sm_90 (ptxas), so it takes the pre-pass. Same operands either way.
    """
    return n_cols == 1 and kw["BLOCK_M"] * kw["BLOCK_K"] <= 64 * 32 * kw["num_warps"]


def _check_grid(n_programs: int) -> None:
    if n_programs > _INT32_MAX:
        msg = f"the GEMM needs {n_programs} programs, more than one launch allows ({_INT32_MAX})."
        raise ShapeError(msg, hint="split a's rows into several calls.")
