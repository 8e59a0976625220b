"""What the Triton launchers (conv1d, gemm) share: codes passed to kernels and tensor-memory checks."""

from __future__ import annotations

import torch

__all__ = [
    "ACT_CODE",
    "ACT_NAME",
    "PREC_CODE",
    "INT32_MAX",
    "describe",
    "is_activation",
    "span",
    "overlap",
    "has_internal_overlap",
]

ACT_CODE = {None: 0, "none": 0, "relu": 1, "gelu": 2, "tanh": 3}
ACT_NAME = {0: None, 1: "relu", 2: "gelu", 3: "tanh"}
PREC_CODE = {"fp32": 0, "tf32": 1, "fp16": 2}
INT32_MAX = 2**31 - 1


def is_activation(value: object) -> bool:
    """True for a name in ACT_CODE (False, not a TypeError, for an unhashable value such as a list)."""
    try:
        return value in ACT_CODE
    except TypeError:
        return False


def describe(t: torch.Tensor) -> str:
    """Shape, dtype and device, as error messages show them."""
    return f"{tuple(t.shape)} ({dtype_name(t)}, {t.device})"


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def span(t: torch.Tensor) -> tuple[int, int] | None:
    """The byte range [start, end) a strided view can touch, or None when it is empty."""
    if t.numel() == 0:
        return None
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    start = t.data_ptr()
    return start, start + (last + 1) * t.element_size()


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Conservative: True when the byte ranges of two views intersect."""
    sa, sb = span(a), span(b)
    if sa is None or sb is None:
        return False
    return sa[0] < sb[1] and sb[0] < sa[1]


def has_internal_overlap(t: torch.Tensor) -> bool:
    """True when two elements of the view can share memory (e.g. expanded or zero strides)."""
    dims = sorted((st, s) for s, st in zip(t.shape, t.stride(), strict=True) if s > 1)
    extent = 0  # offsets reachable by the dims seen so far: [0, extent]
    for st, s in dims:
        if st <= extent:
            return True
        extent += (s - 1) * st
    return False


def check_out(
    out: object,
    *,
    shape: tuple[int, ...],
    expected: str,
    shape_hint: str,
    view_example: str,
    owner: tuple[str, torch.Tensor],
    inputs: dict[str, torch.Tensor | None],
) -> None:
    """Validate an ``out=`` tensor: type, shape, float32, device, no self-overlap, no overlap with inputs."""
    from tsconv.errors import ShapeError

    if not isinstance(out, torch.Tensor):
        short = expected.split(" =")[0]
        raise ShapeError(f"out must be a torch.Tensor or None, got {type(out).__name__}.", hint=f"{short}.")
    if tuple(out.shape) != shape:
        raise ShapeError(f"out must be {expected}, got {describe(out)}.", hint=shape_hint)
    if out.dtype != torch.float32:
        raise ShapeError(f"out must be float32, got {out.dtype}.", hint="results are written in float32.")
    name, ref = owner
    if out.device != ref.device:
        raise ShapeError(
            f"out is on {out.device} but {name} is on {ref.device}.", hint=f"allocate out on {name}'s device."
        )
    if has_internal_overlap(out):
        msg = f"out has overlapping elements (strides {tuple(out.stride())} for shape {tuple(out.shape)})."
        raise ShapeError(msg, hint=f"pass a writable view such as {view_example}, not an expand().")
    for other_name, other in inputs.items():
        if other is not None and overlap(out, other):
            raise ShapeError(
                f"out overlaps {other_name} in memory.", hint="write the result to a separate buffer."
            )
