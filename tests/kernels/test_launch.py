"""Launch plans hold what a replay needs, not the tensors of the call they recorded."""

from __future__ import annotations

import gc
import weakref

import torch

from tsconv.kernels.launch import LaunchPlan


def test_a_plan_does_not_keep_the_recorded_calls_tensors_alive() -> None:
    calls = []

    class Kernel:  # fn[grid](**kwargs), as a Triton kernel is launched (interpreter path of LaunchPlan)
        def fn(self, x, out, n, BLOCK=4):  # noqa: ANN001, ANN202, N803
            return None

        def __getitem__(self, grid):  # noqa: ANN001, ANN204
            return lambda **kw: calls.append((grid, kw))

    x, out, w = torch.ones(1 << 20), torch.empty(1 << 20), torch.ones(3)
    refs = weakref.ref(x), weakref.ref(out)
    plan = LaunchPlan(Kernel(), None, (2,), {"x": x, "out": out, "n": w, "num_warps": 4}, ("x", "out"))
    del x, out
    gc.collect()
    assert all(r() is None for r in refs)
    a, b = torch.zeros(2), torch.zeros(2)
    plan.launch((a, b))
    ((grid, kw),) = calls
    assert grid == (2, 1, 1) and kw["x"] is a and kw["out"] is b and kw["n"] is w and kw["BLOCK"] == 4
    assert kw["num_warps"] == 4
