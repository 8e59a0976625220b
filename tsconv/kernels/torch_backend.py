"""The torch compute path of the engine: one chunk through every stage and the head.

Used on the CPU, and on CUDA until the Triton kernels take over. Works on a time-major chunk that
already carries its halo, convolving in "valid" mode so no padded copy is ever made.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..spec import ResolvedPipeline
from .activations import apply_activation

__all__ = ["TorchBackend"]


@dataclass(frozen=True)
class _DeviceLayer:
    weight: torch.Tensor
    tap_sums: torch.Tensor  # [O, C/groups] float64: sum over taps of each filter, for re-centering
    bias: torch.Tensor | None
    dilation: int
    groups: int
    halo: int
    activation: str


class TorchBackend:
    """Holds a pipeline's weights on a device and runs chunks through it in float32."""

    def __init__(self, plan: ResolvedPipeline, device: torch.device) -> None:
        self.device = device
        self.halo = plan.halo

        def put(a):
            return None if a is None else torch.from_numpy(a).to(device=device, dtype=torch.float32)

        self.layers = tuple(
            _DeviceLayer(
                put(L.weight),
                torch.from_numpy(L.weight.astype(np.float64).sum(axis=2)).to(device),
                put(L.bias),
                L.dilation,
                L.groups,
                L.halo,
                L.activation,
            )
            for L in plan.layers
        )
        self.head = plan.head
        self.head_weight = put(plan.head.weight) if plan.head else None
        self.head_bias = put(plan.head.bias) if plan.head else None

    @torch.no_grad()
    def run(self, x: torch.Tensor, first_row: int, level: torch.Tensor) -> torch.Tensor:
        """Compute outputs for a chunk.

        ``x`` is [halo + n, C] float32, time-major, whose row 0 is global step ``first_row`` (negative
        for the first chunks, where those rows are the zero history). ``level`` [C] is a finite value
        per feature known no later than the feature's first value in the chunk (see ``_first_stage``).
        Returns [n, D] float32.
        """
        start = first_row
        y = None
        for i, layer in enumerate(self.layers):
            if i == 0:
                y = self._first_stage(x, layer, level)
            else:
                y = F.conv1d(y, layer.weight, layer.bias, dilation=layer.dilation, groups=layer.groups)
            y = apply_activation(y, layer.activation)
            start += layer.halo
            # Each stage pads its own input with zeros (F.pad semantics): rows before step 0 are zero
            # history for the next stage, not this stage's response to the previous zeros.
            if start < 0 and i + 1 < len(self.layers):
                y[..., : min(-start, y.shape[-1])] = 0.0
        out = y[0].T
        if self.head_weight is not None:
            out = out @ self.head_weight
            if self.head_bias is not None:
                out += self.head_bias
            out = apply_activation(out, self.head.activation)
        return out

    def _first_stage(self, x: torch.Tensor, layer: _DeviceLayer, c: torch.Tensor) -> torch.Tensor:
        """conv(x) computed as conv(x - c) + conv(c), with c a per-feature level taken from the chunk.

        Raw price levels near 100 leave fp32 about 1e-5 of absolute resolution, and a zero-sum filter
        (a difference, a deviation from a mean) then loses most of its digits. Centering first makes
        the error scale with the moves instead of the level; conv(c) = c * (sum of taps) is added back
        in float64 and is exactly zero for zero-sum filters. ``c`` must not come from a later step than
        the outputs it touches, or causality would hold only up to rounding: the engine passes the last
        value before the chunk, or a feature's first value where it starts inside the chunk (outputs
        before that are NaN anyway).
        """
        centered = (x - c).T.unsqueeze(0)  # [1, C, L]; rows of zero history become -c, as they must
        y = F.conv1d(centered, layer.weight, layer.bias, dilation=layer.dilation, groups=layer.groups)
        per_group = layer.tap_sums.shape[1]
        c64 = c.to(torch.float64).view(layer.groups, per_group)
        out_per_group = layer.tap_sums.shape[0] // layer.groups
        level = (layer.tap_sums.view(layer.groups, out_per_group, per_group) * c64[:, None, :]).sum(-1)
        y += level.reshape(1, -1, 1).to(torch.float32)
        return y
