"""Causal (or valid) conv1d with a fused bias + activation epilogue, as Triton kernels.

This module only re-exports the public names. :func:`conv1d` (:mod:`.api`) validates a call (:mod:`.spec`),
replays its launch plan or hands it to a kernel family: :mod:`.dense` (the implicit GEMM on tensor cores and
its TMA variant), :mod:`.direct` (FMAs in registers: the direct and bank kernels) or :mod:`.window` (generated
register-window kernels for depthwise banks). :mod:`.state` holds what the launchers share at run time;
helpers shared with the GEMM and the fused kernel live in :mod:`tsconv.kernels.common` (Triton) and
:mod:`tsconv.kernels.torch_side` (torch only). Only a call that runs the kernels imports the family modules,
so the torch path on CPU tensors needs no Triton.
"""

from tsconv.kernels.conv1d.api import clear_weight_cache, conv1d
from tsconv.kernels.conv1d.spec import ACTIVATIONS, PADDINGS, PRECISIONS
from tsconv.kernels.conv1d.state import last_launch

__all__ = ["ACTIVATIONS", "PADDINGS", "PRECISIONS", "clear_weight_cache", "conv1d", "last_launch"]
