"""Host-side TMA tensor descriptors for the Hopper kernels, with the TMA's own float32 -> TF32 rounding.

A TMA descriptor whose element type is TFLOAT32 makes the copy engine round float32 to TF32 on its way into
shared memory, so the "tf32" GEMM can feed both operands to wgmma straight from shared memory and still
round ``a`` (the tensor core alone would truncate it: twice the error). Triton 3.7 exposes this as
``TensorDescriptor(..., round_f32_to_tf32=True)``; Triton 3.6 (the GPU hosts' version) builds descriptors
the same way but has no such field, so :func:`descriptor` marks a subclass and a small wrapper around the
NVIDIA driver's descriptor builder sets the element type (11, ``CU_TENSOR_MAP_DATA_TYPE_TFLOAT32``; the
same value 3.7 uses) for descriptors so marked and leaves every other descriptor alone.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

__all__ = ["descriptor", "fits", "rounds_tf32", "usable"]

_NATIVE_ROUNDING = any(f.name == "round_f32_to_tf32" for f in dataclasses.fields(TensorDescriptor))
_TMA_TFLOAT32 = 11


class _RoundingDescriptor(TensorDescriptor):
    """A descriptor whose float32 loads the TMA rounds to TF32 (Triton < 3.7; see the module docstring)."""

    round_f32_to_tf32 = True


def fits(t: torch.Tensor) -> bool:
    """True when ``t`` can back a TMA descriptor: no empty dim, last dim contiguous, 16-byte aligned base and
    strides."""
    if t.numel() == 0 or t.stride(-1) != 1 or t.data_ptr() % 16:
        return False
    return all((st * t.element_size()) % 16 == 0 for st in t.stride()[:-1])


def usable(t: torch.Tensor, precision: str) -> bool:
    """Can a TMA kernel read the operand ``t`` (in its kernel's dim order) in ``precision``? "fp16", or
    "tf32" with float32 ``t`` where descriptors round to TF32 (:func:`rounds_tf32`); a Hopper-or-later GPU
    (or the interpreter, which emulates descriptors on CPU tensors); ``t`` :func:`fits`."""
    if precision == "fp32" or (precision == "tf32" and (t.dtype != torch.float32 or not rounds_tf32())):
        return False
    if t.is_cuda and _capability(t.device.index) < (9, 0):
        return False
    return fits(t)


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    # torch.cuda.get_device_capability (a device-properties lookup) was most of usable()'s 0.04 ms per call
    # under cProfile on the H200 hosts, and the launchers ask on every call
    return torch.cuda.get_device_capability(index)


def rounds_tf32() -> bool:
    """True when descriptors can round float32 to TF32 here (Triton >= 3.7, or the 3.6 builder to wrap).

    Without it a "tf32" TMA kernel would feed truncated operands (twice the error), so callers keep their
    pointer kernels for "tf32" when this is False."""
    if _NATIVE_ROUNDING:
        return True
    try:
        from triton.backends.nvidia import driver as nvd
    except ImportError:
        return False
    return callable(getattr(nvd, "make_tensordesc_arg", None))


def descriptor(t: torch.Tensor, block: list[int], *, round_tf32: bool = False) -> TensorDescriptor:
    """A descriptor over ``t`` (see :func:`fits`) loading ``block`` tiles, zero-filled past the edges;
    ``round_tf32``: float32 values arrive rounded to TF32 (on the GPU; the interpreter loads them as they are)."""
    shape, strides = list(t.shape), list(t.stride())
    if not round_tf32:
        return TensorDescriptor(t, shape, strides, block)
    if _NATIVE_ROUNDING:
        return TensorDescriptor(t, shape, strides, block, round_f32_to_tf32=True)
    if t.is_cuda:
        _patch_driver()
    return _RoundingDescriptor(t, shape, strides, block)


@functools.cache
def _patch_driver() -> None:
    from triton.backends.nvidia import driver as nvd

    build = nvd.make_tensordesc_arg

    def make_tensordesc_arg(arg, metadata):
        if metadata is not None and getattr(arg, "round_f32_to_tf32", False):
            metadata = {**metadata, "elem_type": _TMA_TFLOAT32}
        return build(arg, metadata)

    nvd.make_tensordesc_arg = make_tensordesc_arg
