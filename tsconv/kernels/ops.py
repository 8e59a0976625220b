"""Importing this module registers tsconv's torch custom ops, ``torch.ops.tsconv.conv1d``, ``gemm``,
``conv1d_head`` and ``filter_bank``, for code that calls them directly or loads a graph that uses them.

Each op is registered by the module that defines it, when that module is first imported (``import tsconv``
imports none of them, so that the command line starts without torch's kernels); ``tsconv.conv1d`` and the
others import them on first use.
"""

from __future__ import annotations

import tsconv.kernels.conv1d.api  # noqa: F401  tsconv::conv1d
import tsconv.kernels.filterbank  # noqa: F401  tsconv::filter_bank
import tsconv.kernels.fused  # noqa: F401  tsconv::conv1d_head
import tsconv.kernels.gemm  # noqa: F401  tsconv::gemm
