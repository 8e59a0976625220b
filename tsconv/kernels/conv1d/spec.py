"""What a conv1d call is: its arguments checked and reduced to a :class:`ConvSpec`, which the launchers read.

Public because the fused conv -> head kernel validates its conv with the same rules and messages
(:func:`validate`, :func:`check_tap_sums`) and carries the same spec.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from tsconv.errors import ShapeError
from tsconv.kernels.checks import ACT_CODE as _ACT_CODE
from tsconv.kernels.checks import check_out, is_activation
from tsconv.kernels.checks import describe as _shape

__all__ = [
    "ACTIVATIONS",
    "PADDINGS",
    "PRECISIONS",
    "ConvSpec",
    "check_fallback",
    "check_tap_sums",
    "layout",
    "validate",
]


ACTIVATIONS = (None, "none", "relu", "gelu", "tanh")
PADDINGS = ("causal", "valid")
PRECISIONS = ("fp32", "tf32", "fp16")

_X_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_W_DTYPES = (torch.float16, torch.float32, torch.bfloat16)


@dataclass(frozen=True)
class ConvSpec:
    """A validated call: shapes, options as the kernels take them (``act`` an ACT_CODE), the output length."""

    N: int
    C: int
    L: int
    O: int
    K: int
    groups: int
    dilation: int
    causal: bool
    L_out: int
    act: int
    precision: str
    recenter: bool = False
    recenter_from: int = 0


def _int_arg(name: str, value: object) -> int:
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # int, numpy integers
        except TypeError:
            pass
    msg = f"{name} must be an int, got {value!r} ({type(value).__name__})."
    raise ShapeError(msg, hint=f"pass {name} as a Python int.")


def validate(
    x: object,
    weight: object,
    bias: object,
    out: object,
    *,
    dilation: object,
    groups: object,
    padding: object,
    activation: object,
    precision: object,
    recenter: object = False,
    recenter_from: object = 0,
) -> ConvSpec:
    """Check a call's arguments (a ShapeError with a hint for each misfit) and reduce them to a ConvSpec."""
    if not isinstance(x, torch.Tensor):
        raise ShapeError(
            f"x must be a torch.Tensor, got {type(x).__name__}.", hint="pass a [N, C, L] tensor."
        )
    if not isinstance(weight, torch.Tensor):
        msg = f"weight must be a torch.Tensor, got {type(weight).__name__}."
        raise ShapeError(msg, hint="pass a [O, C/groups, K] tensor.")
    if x.dim() != 3:
        msg = f"x must be [N, C, L] (3 dims), got shape {_shape(x)}."
        raise ShapeError(
            msg,
            hint="for a time-major [N, L, C] buffer pass buf.transpose(1, 2); for one series use x[None].",
        )
    if weight.dim() != 3:
        msg = f"weight must be [O, C/groups, K] (3 dims), got shape {_shape(weight)}."
        raise ShapeError(msg, hint="for a depthwise bank of M filters per channel use shape [C*M, 1, K].")
    if x.dtype not in _X_DTYPES:
        msg = f"x must be float32, float16 or bfloat16, got {x.dtype}."
        raise ShapeError(msg, hint="convert with x.float().")
    if weight.dtype not in _W_DTYPES:
        msg = f"weight must be float16 or float32 (or bfloat16), got {weight.dtype}."
        raise ShapeError(msg, hint="store filter banks as float16 or float32.")
    if x.device.type not in ("cuda", "cpu"):
        msg = f"x must be on a CUDA device or the CPU, got {x.device}."
        raise ShapeError(msg, hint="move it with x.cuda() or x.cpu().")
    if weight.device != x.device:
        msg = f"weight is on {weight.device} but x is on {x.device}."
        raise ShapeError(msg, hint="move the weights to x's device with weight.to(x.device).")

    dilation = _int_arg("dilation", dilation)
    groups = _int_arg("groups", groups)
    N, C, L = x.shape
    O, Cg, K = weight.shape
    if dilation < 1:
        raise ShapeError(f"dilation must be >= 1, got {dilation}.", hint="use dilation=1 for adjacent taps.")
    if groups < 1:
        raise ShapeError(f"groups must be >= 1, got {groups}.", hint="use groups=1 for a dense conv.")
    if K < 1:
        raise ShapeError(f"weight must have at least one tap, got shape {_shape(weight)}.", hint="K >= 1.")
    if C % groups != 0:
        msg = f"groups={groups} must divide the input channels C={C} of x {_shape(x)}."
        raise ShapeError(msg, hint="use groups=C for a depthwise conv, or a divisor of C.")
    if O % groups != 0:
        msg = f"groups={groups} must divide the output channels O={O} of weight {_shape(weight)}."
        raise ShapeError(msg, hint="a depthwise bank of M filters per channel has O = C*M rows.")
    if Cg != C // groups:
        msg = (
            f"weight must be [O, C/groups, K] = [{O}, {C // groups}, {K}] for x with C={C} and "
            f"groups={groups}, got {_shape(weight)}."
        )
        raise ShapeError(msg, hint="check groups; a depthwise weight is [C*M, 1, K] with groups=C.")

    if padding not in PADDINGS:
        raise ShapeError(
            f"padding must be 'causal' or 'valid', got {padding!r}.", hint="use padding='causal'."
        )
    causal = padding == "causal"
    L_out = L if causal else L - (K - 1) * dilation
    if not causal and L_out < 1:
        msg = f"padding='valid' needs L >= (K-1)*dilation + 1 = {(K - 1) * dilation + 1} steps, x has L={L}."
        raise ShapeError(msg, hint="pass a longer input (with its halo) or use padding='causal'.")
    if not is_activation(activation):
        msg = f"activation must be one of None, 'none', 'relu', 'gelu', 'tanh', got {activation!r}."
        raise ShapeError(msg, hint="use activation=None for a plain conv.")
    if precision not in PRECISIONS:
        msg = f"precision must be 'fp32', 'tf32' or 'fp16', got {precision!r}."
        raise ShapeError(msg, hint="'fp32' is the default and the only mode fit for raw price levels.")
    if not isinstance(recenter, bool):
        raise ShapeError(f"recenter must be True or False, got {recenter!r}.", hint="pass recenter=True.")
    recenter_from = _int_arg("recenter_from", recenter_from)
    if recenter_from < 0:
        msg = f"recenter_from must be >= 0 (an input row), got {recenter_from}."
        raise ShapeError(msg, hint="pass the number of zero-history rows at the start of x, or 0.")
    if recenter and precision != "fp32":
        msg = f"recenter=True is for precision='fp32', got precision={precision!r}."
        raise ShapeError(
            msg, hint="use precision='fp32' (the tensor-core modes are unfit for raw levels anyway)."
        )

    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise ShapeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}.", hint="[O].")
        if bias.dim() != 1 or bias.shape[0] != O:
            raise ShapeError(
                f"bias must be [O] = [{O}], got {_shape(bias)}.", hint="one bias per output channel."
            )
        if bias.dtype not in _W_DTYPES:
            raise ShapeError(f"bias must be a float tensor, got {bias.dtype}.", hint="use bias.float().")
        if bias.device != x.device:
            raise ShapeError(f"bias is on {bias.device} but x is on {x.device}.", hint="bias.to(x.device).")

    if out is not None:
        check_out(
            out,
            shape=(N, O, L_out),
            expected=f"[N, O, L_out] = {(N, O, L_out)} ({padding} padding)",
            shape_hint="for a time-major [N, L, O] buffer pass buf.transpose(1, 2).",
            view_example="buf.transpose(1, 2)",
            owner=("x", x),
            inputs={"x": x, "weight": weight, "bias": bias},
        )

    return ConvSpec(
        N,
        C,
        L,
        O,
        K,
        groups,
        dilation,
        causal,
        L_out,
        _ACT_CODE[activation],
        precision,
        recenter,
        recenter_from,
    )


def check_tap_sums(tap_sums: object, weight: torch.Tensor, spec: ConvSpec) -> None:
    """Refuse ``tap_sums`` given without ``recenter`` or not float64 [O, C/groups] on the weights' device."""
    if tap_sums is None:
        return
    if not spec.recenter:
        raise ShapeError("tap_sums is for recenter=True.", hint="pass recenter=True, or leave tap_sums out.")
    want = (spec.O, spec.C // spec.groups)
    if (
        not isinstance(tap_sums, torch.Tensor)
        or tuple(tap_sums.shape) != want
        or tap_sums.dtype != torch.float64
        or tap_sums.device != weight.device
        or not tap_sums.is_contiguous()
    ):
        got = _shape(tap_sums) if isinstance(tap_sums, torch.Tensor) else type(tap_sums).__name__
        raise ShapeError(
            f"tap_sums must be a contiguous float64 tensor of shape {list(want)} on {weight.device}, got {got}.",
            hint="pass weight.double().sum(dim=2) of the weights as given.",
        )


def check_fallback(fallback: object, x: torch.Tensor, spec: ConvSpec) -> None:
    """Refuse ``recenter_fallback`` given without ``recenter`` or not float32 [C] contiguous on x's device."""
    if fallback is None:
        return
    if not spec.recenter:
        msg = "recenter_fallback is for recenter=True."
        raise ShapeError(msg, hint="pass recenter=True, or leave recenter_fallback out.")
    if (
        not isinstance(fallback, torch.Tensor)
        or tuple(fallback.shape) != (spec.C,)
        or fallback.dtype != torch.float32
        or fallback.device != x.device
        or not fallback.is_contiguous()
    ):
        got = _shape(fallback) if isinstance(fallback, torch.Tensor) else type(fallback).__name__
        raise ShapeError(
            f"recenter_fallback must be a contiguous float32 tensor of shape [{spec.C}] on {x.device}, got {got}.",
            hint="pass one level per input channel, e.g. each channel's last value before x.",
        )


def layout(t: torch.Tensor) -> str:
    """'tm' for time-major views (channel stride 1), 'cm' for channel-major (time stride 1), else 'st'."""
    if t.stride(1) == 1:
        return "tm"
    if t.stride(2) == 1:
        return "cm"
    return "st"
