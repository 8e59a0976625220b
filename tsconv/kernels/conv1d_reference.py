"""Float64 reference for :func:`tsconv.kernels.conv1d.conv1d`, shared by tests and benchmarks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "conv1d_reference",
    "relative_error",
    "round_to_tf32",
    "round_to_tf32_rne",
    "torch_conv1d_in_precision",
]


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation in (None, "none"):
        return y
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu":
        return F.gelu(y)
    if activation == "tanh":
        return torch.tanh(y)
    raise ValueError(f"unknown activation {activation!r}")


def _pad(x: torch.Tensor, K: int, dilation: int, padding: str) -> torch.Tensor:
    if padding == "causal":
        return F.pad(x, ((K - 1) * dilation, 0))
    if padding != "valid":
        raise ValueError(f"padding must be 'causal' or 'valid', got {padding!r}")
    return x


def conv1d_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    dilation: int = 1,
    groups: int = 1,
    padding: str = "causal",
    activation: str | None = None,
) -> torch.Tensor:
    """The conv1d result computed in float64 with torch (F.pad + F.conv1d), on the inputs' device.

    Inputs and weights are taken at their stored values (upcast exactly to float64). "causal" left-pads by
    (K - 1) * dilation zeros (output length L); "valid" does not pad (length L - (K - 1) * dilation).
    Returns a contiguous float64 [N, O, L_out] tensor.
    """
    x64 = _pad(x.to(torch.float64), weight.shape[-1], dilation, padding)
    b64 = None if bias is None else bias.to(torch.float64)
    y = F.conv1d(x64, weight.to(torch.float64), b64, dilation=dilation, groups=groups)
    return _activate(y, activation)


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| / max |ref| (normwise, so near-zero outputs of zero-sum filters do not blow it up)."""
    scale = ref.abs().max().item()
    diff = (y.to(torch.float64) - ref).abs().max().item()
    return diff / scale if scale > 0 else diff


def round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to the nearest TF32 value (10-bit mantissa; ties away from zero, like PTX
    ``cvt.rna.tf32.f32``), as a new float32 tensor."""
    bits = t.to(torch.float32).contiguous().view(torch.int32)
    return ((bits + 0x1000) & -8192).view(torch.float32)


def round_to_tf32_rne(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32 with round-to-nearest-even, as a new float32 tensor on ``t``'s device.

    Computed in float64 arithmetic, not with bit tricks (an independent reference for the kernels'
    ``_round_tf32_rne``): a finite value v = m * 2^e (m in [0.5, 1)) is rounded to a multiple of the TF32
    spacing q = 2^(e - 11) (11 significant bits), at least 2^-136 (TF32's subnormal spacing), by ``np.rint``
    (ties to even); a result of 2^128 or more becomes +-inf in float32. NaN (as a quiet NaN, sign kept) and
    +-inf pass through; -0.0 and negative values rounding to zero give -0.0.
    """
    import numpy as np

    v32 = t.detach().to(torch.float32).cpu().contiguous().numpy()
    with np.errstate(over="ignore", invalid="ignore"):  # signalling NaNs, overflow to inf in the last cast
        v = v32.astype(np.float64)
        finite = np.isfinite(v)
        _, e = np.frexp(np.where(finite & (v != 0), v, 1.0))
        q = np.ldexp(1.0, np.maximum(e - 11, -136).astype(np.int32))
        r = np.where(finite, np.rint(v / q) * q, v).astype(np.float32)
    nan = np.isnan(v32)
    if nan.any():  # quiet, sign and high payload kept, low 13 bits cleared (what the kernel produces)
        bits = v32.view(np.int32)
        r = np.where(nan, ((bits | np.int32(0x00400000)) & np.int32(-8192)).view(np.float32), r)
    return torch.from_numpy(np.ascontiguousarray(r)).to(t.device)


def torch_conv1d_in_precision(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    dilation: int = 1,
    groups: int = 1,
    padding: str = "causal",
    activation: str | None = None,
    precision: str = "fp32",
    emulate: bool = False,
) -> torch.Tensor:
    """torch's own conv1d in a precision class, the yardstick for the kernel's error (float32 result).

    On CUDA: cuDNN in float32 without TF32 ("fp32"), with TF32 allowed ("tf32"), or on float16 inputs and
    weights ("fp16"). On the CPU, which has no TF32 or float16 convolution path, or with ``emulate=True``,
    "tf32" and "fp16" are emulated as tensor cores compute them: inputs and weights rounded to TF32 /
    float16, exact products, float32 accumulation (a float32 conv of the rounded operands). The emulation
    does not depend on which algorithm cuDNN picks (with TF32 allowed it may still pick a float32 one).
    """
    K = weight.shape[-1]
    b = None if bias is None else bias.float()
    if x.is_cuda and not emulate:
        flag = torch.backends.cudnn.allow_tf32
        try:
            torch.backends.cudnn.allow_tf32 = precision == "tf32"
            if precision == "fp16":
                xp = _pad(x.half(), K, dilation, padding)
                bh = None if b is None else b.half()
                y = F.conv1d(xp, weight.half(), bh, dilation=dilation, groups=groups).float()
            else:
                xp = _pad(x.float(), K, dilation, padding)
                y = F.conv1d(xp, weight.float(), b, dilation=dilation, groups=groups)
        finally:
            torch.backends.cudnn.allow_tf32 = flag
        return _activate(y, activation)
    if precision == "fp32":
        xr, wr = x.float(), weight.float()
    elif precision == "tf32":
        xr, wr = round_to_tf32(x), round_to_tf32(weight)
    elif precision == "fp16":
        xr, wr = x.half().float(), weight.half().float()
    else:
        raise ValueError(f"unknown precision {precision!r}")
    y = F.conv1d(_pad(xr, K, dilation, padding), wr, b, dilation=dilation, groups=groups)
    return _activate(y, activation)


# --------------------------------------------------------------------------------------------------------
# a numerical model of Hopper tensor-core dots, for the Triton interpreter
# --------------------------------------------------------------------------------------------------------


def _rz_to_float32(s):
    """float64 -> float32 rounded toward zero."""
    import numpy as np

    r = s.astype(np.float32)
    over = np.abs(r.astype(np.float64)) > np.abs(s)
    return np.where(over, np.nextafter(r, np.float32(0)), r)


def tensor_core_dot(a, b, c, *, tf32: bool = True, block: int = 4, extra_bits: int = 0):
    """``c + a @ b`` as an NVIDIA tensor core computes it (numpy arrays; float32 result).

    The model (Fasi et al. 2021 for V100/A100, Khattak & Mikaitis 2025 for H100): float32 operands are
    truncated to TF32 (the low 13 mantissa bits ignored; the kernels' "tf32" modes round float32 inputs to
    TF32 beforehand, ties to even, so the truncation leaves those unchanged, as on the hardware; switching the
    rounding off, e.g. ``conv1d.state.ROUND_X_TF32 = False``, shows the old truncation), products are exact, and
    every ``block`` products
    are added to the accumulator in one step: all terms are aligned to the largest exponent among them and the
    accumulator, bits below ``23 + extra_bits`` places under it are dropped (toward zero), and the sum is
    rounded toward zero to float32. Round-toward-zero makes the accumulation error biased: it grows linearly
    with the number of steps on an accumulator that keeps its sign, where round-to-nearest grows like a
    square root. ``block`` and ``extra_bits`` are the model's unknowns; tests run several values.
    """
    import numpy as np

    if tf32 and a.dtype == np.float32:
        a = (a.view(np.int32) & np.int32(-8192)).view(np.float32)
    if tf32 and b.dtype == np.float32:
        b = (b.view(np.int32) & np.int32(-8192)).view(np.float32)
    A = a.astype(np.float64)
    B = b.astype(np.float64)
    acc = c.astype(np.float32)
    plain = None
    with np.errstate(all="ignore"):
        for g in range(0, A.shape[-1], block):
            P = A[..., :, g : g + block, None] * B[..., None, g : g + block, :]  # [M, block, N], exact
            terms = np.concatenate([acc.astype(np.float64)[..., :, None, :], P], axis=-2)
            mag = np.abs(terms).max(axis=-2)
            finite = np.isfinite(mag)
            _, e = np.frexp(np.where(finite & (mag > 0), mag, 1.0))
            grid = np.ldexp(1.0, (e - 1 - 23 - extra_bits).astype(np.int32))[..., :, None, :]
            s = (np.trunc(terms / grid) * grid).sum(axis=-2)
            if not finite.all():  # inf / nan: IEEE semantics
                plain = terms.sum(axis=-2)
                s = np.where(finite, s, plain)
            acc = _rz_to_float32(s)
    return acc.astype(np.float32)


class emulate_tensor_cores:  # noqa: N801 - used as a context manager, like torch.no_grad
    """Within this context, ``tl.dot`` in the Triton interpreter follows :func:`tensor_core_dot`.

    ``ieee`` dots (input_precision="ieee") stay exact float32 matmuls; float16 / bfloat16 operands are exact
    in the model, float32 operands are truncated to TF32 (as the hardware does with tf32 dots).
    """

    def __init__(self, *, block: int = 4, extra_bits: int = 0) -> None:
        self.block, self.extra_bits = block, extra_bits
        self._saved = None
        self.calls = 0

    def __enter__(self):
        from triton.runtime import interpreter

        cls = interpreter.InterpreterBuilder
        self._saved = cls.create_dot
        emu = self

        def create_dot(builder, a, b, d, input_precision, max_num_imprecise_acc):
            if "IEEE" in str(input_precision).upper():
                return emu._saved(builder, a, b, d, input_precision, max_num_imprecise_acc)
            emu.calls += 1
            out = tensor_core_dot(
                a.data, b.data, d.data, tf32=True, block=emu.block, extra_bits=emu.extra_bits
            )
            return interpreter.TensorHandle(out.astype(d.data.dtype), d.dtype.scalar)

        cls.create_dot = create_dot
        return self

    def __exit__(self, *exc: object) -> None:
        from triton.runtime import interpreter

        interpreter.InterpreterBuilder.create_dot = self._saved
