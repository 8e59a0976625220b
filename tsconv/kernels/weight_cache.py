"""Derived copies of weight tensors (packed, rounded, rearranged), kept while the weights stay unchanged.

A launcher that rearranges its weights before every launch (the GEMM's TF32 packing, conv1d's [K, O, C]
layout) pays a few small kernels and allocations per call: 0.13 ms per GEMM call on the H200 before the GEMM
cached them (benchmarks/NOTES.md, "Launch plans and weight caches"), the better part of a small conv's time.
:class:`WeightCache` keeps the derived copy keyed by (tag, data_ptr, shape, strides, dtype, device). An entry
holds a weak reference to the tensor that owns the storage (a view's base, so ``w.T`` made afresh on every
call still hits) and the version counter it was built at: an in-place write to the weights (or to any view of
their storage) bumps the counter and the next call rebuilds; a freed tensor drops its entry. tsconv's own
kernels write ``out=`` from Triton, which torch does not see, so the public calls bump it themselves
(:func:`writes_out`), as torch's ``out=`` ops do. Writes that bypass autograd's version counter (through
``.data``, or from outside torch) are not seen: ``clear()`` them (``tsconv.kernels.conv1d.clear_weight_cache``),
or pass a copy (``tsconv.nn`` modules do, each call).
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch
from torch.autograd.graph import increment_version

__all__ = ["WeightCache", "writes_out"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def writes_out(fn: F) -> F:
    """Wrap a kernel call taking ``out=``: after it, ``out``'s version counter is bumped, as torch's own
    ``out=`` ops bump it, so a tensor the kernel wrote and then passed as weights is not served a copy
    cached from its earlier values (a Triton launch writes memory torch does not track)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        y = fn(*args, **kwargs)
        out = kwargs.get("out")
        if out is not None and not torch.compiler.is_compiling():  # compiled: filled by a torch copy
            increment_version(out)
        return y

    return call  # type: ignore[return-value]


class WeightCache:
    """An LRU of ``build(w)`` results per weight tensor and tag (see the module docstring)."""

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self.entries: OrderedDict[tuple, tuple[weakref.ref, int, object]] = OrderedDict()

    def get(self, w: torch.Tensor, tag: Hashable, build: Callable[[torch.Tensor], T]) -> T:
        """``build(w)``, or the copy built for the same storage, layout, tag and version. An inference tensor
        (made under ``torch.inference_mode()``) has no version counter to tell an in-place write by, so its
        copy is built afresh each call (reading ``_version`` raised for it)."""
        if w.is_inference():
            return build(w)
        key = (tag, w.data_ptr(), tuple(w.shape), w.stride(), w.dtype, w.device)
        owner = w if w._base is None else w._base
        hit = self.entries.get(key)
        if hit is not None:
            ref, version, value = hit
            if ref() is owner and version == w._version:
                self.entries.move_to_end(key)
                return value  # type: ignore[return-value]
            del self.entries[key]
        value = build(w)

        # The dict is bound as a default: at interpreter exit the module's globals may already be None
        # when the last weights are collected.
        def _drop(_ref: weakref.ref, key: tuple = key, entries: OrderedDict = self.entries) -> None:
            entry = entries.get(key)
            if entry is not None and entry[0] is _ref:
                entries.pop(key, None)

        self.entries[key] = (weakref.ref(owner, _drop), w._version, value)
        while len(self.entries) > self._size:
            self.entries.popitem(last=False)
        return value

    def clear(self) -> None:
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)
