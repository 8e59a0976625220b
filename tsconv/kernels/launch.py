"""Replaying a Triton launch without Triton's per-call binding: the launch plans of the small-call path.

``kernel[grid](*args, **meta)`` binds every argument, computes a specialization key and looks the compiled
kernel up on each call; with our launchers' own validation and tuner lookup on top, a call cost 0.08-0.12 ms
of host time on the H200 hosts (benchmarks/NOTES.md, "Launch plans and weight caches"): three to four times
the kernel itself for a [65536, 256] x [256, 64] head. A :class:`LaunchPlan` records one launch (the compiled
kernel, the grid and the arguments in the kernel's parameter order) so that a later call whose arguments
specialize the same way (same integers, dtypes and 16-byte pointer alignments: the launcher's cache key says
so) swaps in its tensors and calls the compiled kernel's launcher directly, as ``JITFunction.run`` itself does
after its lookup. The tensor slots may hold TMA descriptors built from the call's tensors (the launcher's
wrapper encodes them per launch). ``gemm`` and ``conv1d`` calls use plans (dense, depthwise and grouped
paths): a tf32 / fp16 conv call through the TMA kernel cost 0.12-0.30 ms of host time through the full path on
the H200 hosts, 0.04-0.09 ms replayed (benchmarks/NOTES.md, "Launch plans and weight caches").

Under the Triton interpreter there is no compiled kernel: a plan then re-enters ``kernel[grid]`` with the
recorded arguments, so the plan logic (keys, tensor slots) is testable on the CPU.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch

from tsconv.kernels.checks import span

__all__ = [
    "LaunchPlan",
    "PlanCache",
    "extent",
    "launch_recorded",
    "overlaps",
    "tensor_key",
]

# Options JITFunction.run takes as keywords that are not kernel parameters.
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_pdl")


class LaunchPlan:
    """One recorded launch of ``fn`` that :meth:`launch` repeats with other tensors in the same places."""

    __slots__ = ("_compiled", "_fn", "_grid", "_kw", "_names", "_slots", "_values")

    def __init__(
        self, fn: object, compiled: object, grid: tuple[int, ...], kwargs: dict, slots: Sequence[str]
    ):
        """``kwargs``: every argument of the recorded ``fn[grid](**kwargs)`` call by name (options included);
        ``slots``: the names of the tensor arguments :meth:`launch` replaces, in the order it receives them."""
        params = list(inspect.signature(getattr(fn, "fn", fn)).parameters.values())
        values = []
        for p in params:
            if p.name in kwargs:
                values.append(kwargs[p.name])
            elif p.default is not inspect.Parameter.empty:
                values.append(p.default)
            else:
                raise TypeError(f"launch plan: no value for kernel parameter {p.name!r}")
        self._names = [p.name for p in params]
        self._slots = [self._names.index(s) for s in slots]
        # Every launch fills the slots; keeping the recorded call's tensors would pin them (the engine's step
        # buffers stayed allocated after its runs: 800 MB on the H200).
        for i in self._slots:
            values[i] = None
        self._values = values
        self._grid = tuple(grid) + (1,) * (3 - len(grid))
        self._kw = {k: v for k, v in kwargs.items() if k in _OPTIONS}
        self._fn = fn
        self._compiled = compiled if _is_compiled(compiled) else None

    @property
    def compiled(self) -> bool:
        """True when :meth:`launch` calls the compiled kernel directly (a GPU launch, not the interpreter)."""
        return self._compiled is not None

    def launch(self, tensors: Sequence[torch.Tensor]) -> None:
        """Launch with ``tensors`` in the recorded slots (on the current device and stream)."""
        values = self._values.copy()
        for i, t in zip(self._slots, tensors, strict=True):
            values[i] = t
        ck = self._compiled
        if ck is None:
            self._fn[self._grid](**dict(zip(self._names, values, strict=True)), **self._kw)
            return
        from triton import knobs
        from triton.runtime.driver import driver

        stream = driver.active.get_current_stream(torch.cuda.current_device())
        enter = knobs.runtime.launch_enter_hook
        meta = None if enter is None else ck.launch_metadata(self._grid, stream, *values)
        g0, g1, g2 = self._grid
        ck.run(
            g0,
            g1,
            g2,
            stream,
            ck.function,
            ck.packed_metadata,
            meta,
            enter,
            knobs.runtime.launch_exit_hook,
            *values,
        )


def _is_compiled(obj: object) -> bool:
    try:
        from triton.compiler import CompiledKernel
    except ImportError:  # pragma: no cover - every supported Triton has it
        return False
    return isinstance(obj, CompiledKernel)


class PlanCache:
    """A bounded LRU of launch plans by key (a tuple of everything the launch depends on)."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._plans: OrderedDict[Hashable, object] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> object | None:
        try:
            plan = self._plans.get(key)
        except TypeError:  # an unhashable option (e.g. a list): the validating path reports it
            plan = None
        if plan is None:
            self.misses += 1
            return None
        self.hits += 1
        return plan

    def put(self, key: Hashable, plan: object) -> None:
        try:
            self._plans[key] = plan
        except TypeError:
            return
        self._plans.move_to_end(key)
        while len(self._plans) > self._size:
            self._plans.popitem(last=False)

    def clear(self) -> None:
        self._plans.clear()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._plans)


def tensor_key(t: torch.Tensor) -> tuple:
    """What validation and kernel specialization read from a tensor: shape, strides, dtype, device and
    whether its base pointer is 16-byte aligned (Triton specializes on that; TMA needs it)."""
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)


def extent(t: torch.Tensor | None) -> int:
    """Bytes from the first to one past the last element a strided view can touch (0: empty or None); fixed
    by the layout, so a plan records it once and checks overlaps with pointer reads alone."""
    s = None if t is None else span(t)
    return 0 if s is None else s[1] - s[0]


def overlaps(start: int, size: int, t: torch.Tensor | None, t_size: int) -> bool:
    """Does the byte range [start, start + size) meet ``t``'s range of ``t_size`` bytes (see :func:`extent`)?"""
    if t is None or size == 0 or t_size == 0:
        return False
    p = t.data_ptr()
    return p < start + size and start < p + t_size


def launch_recorded(recorded: dict, fn: object, grid: tuple[int, ...], args: tuple, kwargs: dict) -> object:
    """``fn[grid](*args, **kwargs)``, noting in ``recorded`` what a :class:`LaunchPlan` needs to repeat it
    (``fn``, the returned compiled kernel, ``grid`` and every argument by name)."""
    ret = fn[grid](*args, **kwargs)
    named = dict(zip(fn.arg_names, args, strict=False))
    recorded.update(fn=fn, ret=ret, grid=grid, args={**named, **kwargs})
    return ret
