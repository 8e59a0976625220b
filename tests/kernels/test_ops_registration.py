"""Registering tsconv's torch ops (what torch.compile sees) must not import modules that are loaded lazily.

torch asks inspect for the registering module; inspect's first lookup of a file reads ``__file__`` of every
module in ``sys.modules``, which imports lazily loaded ones (cupy leaves cupyx and cupy.testing so once zarr
has imported it): over a second of every fresh ``tsconv process`` on the GPU machine.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import importlib.abc, importlib.util, sys
    import tsconv.kernels.common, triton.tools.tensor_descriptor  # what the kernels import beside themselves

    class Loader(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            module.__file__ = "/nonexistent/lazy_probe.py"

    spec = importlib.util.spec_from_loader("lazy_probe", importlib.util.LazyLoader(Loader()))
    m = importlib.util.module_from_spec(spec)
    sys.modules["lazy_probe"] = m
    spec.loader.exec_module(m)
    import tsconv.kernels.fused, tsconv.kernels.filterbank  # registers tsconv::conv1d, gemm, conv1d_head, filter_bank
    import torch
    assert hasattr(torch.ops.tsconv, "conv1d") and hasattr(torch.ops.tsconv, "filter_bank")
    print("loaded" if "__file__" in object.__getattribute__(m, "__dict__") else "lazy")
    """
)


def test_registering_the_ops_leaves_lazily_loaded_modules_unloaded() -> None:
    p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "lazy"
