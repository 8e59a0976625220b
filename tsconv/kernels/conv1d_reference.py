"""Float64 reference for :func:`tsconv.kernels.conv1d.conv1d`, shared by tests and benchmarks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["conv1d_reference", "relative_error", "round_to_tf32", "torch_conv1d_in_precision"]


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
    """float32 values rounded to the nearest TF32 value (10-bit mantissa), as a new float32 tensor."""
    bits = t.to(torch.float32).contiguous().view(torch.int32)
    return ((bits + 0x1000) & -8192).view(torch.float32)


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
