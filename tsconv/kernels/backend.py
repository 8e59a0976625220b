"""The compute step of the engine: one chunk through every stage and the head.

On the CPU each stage is torch's ``F.conv1d``; on CUDA it is tsconv's Triton ``conv1d`` (fp32-accurate,
FP16-stored weights upcast in the kernel, bias and activation fused, time-major in and out, so nothing
is transposed or padded). Chunks arrive time-major with their halo, and stages run in "valid" mode.
A ``[preprocess]`` transform and z-score run first, as torch ops in float64 on the same device, also in
"valid" mode over the preprocessing's ``pre_halo`` rows. The last stage and the head run by one of three
paths (torch matmul, tsconv's gemm, or the fused conv -> head kernel), on CUDA the fastest as measured on
first use of a shape class (:mod:`tsconv.kernels.head`; ``TSCONV_HEAD_PATH`` forces one).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..spec import ResolvedPipeline
from .activations import apply_activation

__all__ = ["Backend"]


@dataclass(frozen=True)
class _DeviceLayer:
    weight: torch.Tensor  # the stored values: float16 for the Triton kernel, else float32
    tap_sums: torch.Tensor  # [O, C/groups] float64: sum over taps of each filter, for re-centering
    bias: torch.Tensor | None  # float32
    bias64: torch.Tensor  # [O] float64 (zeros without bias)
    dilation: int
    groups: int
    halo: int
    activation: str


def _tap_sums(w: np.ndarray) -> np.ndarray:
    """``w.astype(float64).sum(axis=2)`` tap by tap: 1.5 ms instead of 6 for a [256, 1024, 5] conv on the
    development VM (numpy reduces a short last axis slowly), about 4% of the e2e job before."""
    acc = w[..., 0].astype(np.float64)
    for k in range(1, w.shape[2]):
        acc += w[..., k]
    return acc


def _conv_layer(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    layer: _DeviceLayer,
    triton: bool,
    recenter: bool = False,
    recenter_from: int = 0,
) -> torch.Tensor:
    """act(conv_valid(x, w) + bias) for x [1, C, L] (any strides); returns [1, O, L - halo].

    ``recenter``: conv1d's per-block re-centering (the Triton kernels only; the first stage on levels),
    with ``recenter_from`` leading rows of zero history."""
    if triton:
        from .conv1d import conv1d

        return conv1d(
            x,
            layer.weight,
            bias,
            dilation=layer.dilation,
            groups=layer.groups,
            padding="valid",
            activation=layer.activation,
            precision="fp32",
            recenter=recenter,
            recenter_from=recenter_from,
        )
    y = F.conv1d(x, layer.weight, bias, dilation=layer.dilation, groups=layer.groups)
    return apply_activation(y, layer.activation)


class Backend:
    """Holds a pipeline's weights on a device and runs chunks through it, computing in float32."""

    def __init__(
        self, plan: ResolvedPipeline, device: torch.device, *, use_triton: bool | None = None
    ) -> None:
        """``use_triton`` defaults to CUDA devices; tests force it on CPU tensors under TRITON_INTERPRET=1."""
        self.device = device
        self.halo = plan.halo
        self.triton = device.type == "cuda" if use_triton is None else use_triton

        def put(a: np.ndarray | None, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
            return None if a is None else torch.from_numpy(a).to(device=device, dtype=dtype)

        # The Triton kernel upcasts FP16-stored weights itself; torch's conv wants float32 (the stored
        # values, exactly), made once here rather than per chunk.
        def stored(L) -> torch.Tensor:  # noqa: ANN001
            half = L.weight_dtype == "float16" and self.triton
            return put(L.weight, torch.float16 if half else torch.float32)

        self.layers = tuple(
            _DeviceLayer(
                weight=stored(L),
                tap_sums=put(_tap_sums(L.weight), torch.float64),
                bias=put(L.bias),
                bias64=put(L.bias if L.bias is not None else np.zeros(L.out_channels), torch.float64),
                dilation=L.dilation,
                groups=L.groups,
                halo=L.halo,
                activation=L.activation,
            )
            for L in plan.layers
        )
        pre = plan.preprocess
        self.pre = pre if pre is not None and pre.computes else None
        self.pre_halo = plan.pre_halo
        # Level data (raw values, or their logs): the Triton kernels re-center the first stage per block of
        # outputs as well (conv1d's ``recenter``), so the batched engine's error does not grow with the drift
        # of a long step away from its one centering level (benchmarks/NOTES.md, seventh session). Returns,
        # differences and z-scores are not levels. The same rule as the level _preprocess returns.
        log_levels = self.pre is not None and self.pre.transform == "log" and self.pre.zscore is None
        self.recenter_first = self.triton and (self.pre is None or log_levels)
        self.head = plan.head
        self.head_weight = put(plan.head.weight) if plan.head else None
        self.head_bias = put(plan.head.bias) if plan.head else None
        self._head = self._head_paths(plan) if plan.head is not None and self.layers else None

    def _head_paths(self, plan: ResolvedPipeline):  # noqa: ANN202 - HeadPaths, imported lazily
        """The last stage + head by the measured-fastest path on CUDA (see :mod:`tsconv.kernels.head`).

        On the CPU: the torch path, unless Triton runs interpreted here and ``TSCONV_HEAD_PATH`` forces one.
        """
        from . import head

        forced = head.requested_path()
        measure = forced is None and head._can_measure(self.device)
        active = self.triton and (
            self.device.type == "cuda" or (head.INTERPRETED and (forced is not None or measure))
        )
        last = self.layers[-1]
        recenter = self.recenter_first and len(self.layers) == 1  # the last stage is also the first
        # The Triton paths read float16-stored head weights as float16 (exactly their values).
        half = active and plan.head.weight_dtype == "float16"
        return head.HeadPaths(
            weight=last.weight,
            dilation=last.dilation,
            groups=last.groups,
            activation=last.activation,
            head_weight=self.head_weight.to(torch.float16) if half else self.head_weight,
            head_bias=self.head_bias,
            head_activation=plan.head.activation,
            head_weight_torch=self.head_weight,
            # Not a closure over self: a Backend <-> HeadPaths cycle kept each run's GPU weights alive until
            # the cyclic GC ran (4 earlier runs' weights, 184 MB at 4096 features, in one process's peak).
            conv=functools.partial(_conv_layer, layer=last, triton=self.triton, recenter=recenter),
            triton=active,
            recenter=recenter and active,
            forced=forced if active else None,
            measure=active and measure,
        )

    @property
    def head_path(self) -> str | None:
        """How the last stage and the head were computed ("unfused", "gemm" or "fused": the path of most
        rows so far); None without a head or before the first chunk."""
        return None if self._head is None else self._head.path

    @torch.no_grad()
    def run(self, x: torch.Tensor, first_row: int, level: torch.Tensor) -> torch.Tensor:
        """Compute outputs for a chunk.

        ``x`` is [halo + n, C] float32, time-major, whose row 0 is global step ``first_row`` (negative
        for the first chunks, where those rows are the zero history). ``level`` [C] is a finite value
        per feature known no later than the feature's first value in the chunk (see ``_first_stage``).
        Returns [n, D] float32.
        """
        if self.pre is not None:
            x, level = self._preprocess(x, first_row, level)
            first_row += self.pre_halo
        return self._stages(x, first_row, level, centered=False)

    @torch.no_grad()
    def run_centered(self, xc: torch.Tensor, first_row: int, level: torch.Tensor) -> torch.Tensor:
        """:meth:`run` for an input already centered: ``xc`` = x - ``level`` (history rows included).

        The batched GPU engine prepares ``xc`` in one pass over the input (:mod:`tsconv.stream.prep`);
        pipelines with a computing ``[preprocess]`` go through :meth:`run`.
        """
        if self.pre is not None:
            msg = "run_centered() is for pipelines without a computing [preprocess]"
            raise RuntimeError(msg)
        return self._stages(xc, first_row, level, centered=True)

    def _stages(
        self, x: torch.Tensor, first_row: int, level: torch.Tensor, *, centered: bool
    ) -> torch.Tensor:
        start = first_row
        y = None
        last = len(self.layers) - 1
        history = min(max(-first_row, 0), x.shape[0])  # leading rows before step 0: zero history
        for i, layer in enumerate(self.layers):
            if i == 0:
                y, bias = self._first_stage_input(x, layer, level, centered=centered)
            else:
                bias = layer.bias
            if i == last and self._head is not None:
                # the last stage and the head, by the chosen path
                return self._head.run(y, bias, recenter_from=history if i == 0 else 0)
            first = i == 0 and self.recenter_first
            y = _conv_layer(
                y,
                bias,
                layer=layer,
                triton=self.triton,
                recenter=first,
                recenter_from=history if first else 0,
            )
            start += layer.halo
            # Each stage pads its own input with zeros (F.pad semantics): rows before step 0 are zero
            # history for the next stage, not this stage's response to the previous zeros.
            if start < 0 and i + 1 < len(self.layers):
                y[..., : min(-start, y.shape[-1])] = 0.0
        return y[0].T

    def _first_stage(
        self, x: torch.Tensor, layer: _DeviceLayer, c: torch.Tensor, *, centered: bool = False
    ) -> torch.Tensor:
        """conv(x) computed as conv(x - c) + conv(c) (see :meth:`_first_stage_input`)."""
        xt, bias = self._first_stage_input(x, layer, c, centered=centered)
        # (tests: no history rows)
        return _conv_layer(xt, bias, layer=layer, triton=self.triton, recenter=self.recenter_first)

    def _first_stage_input(
        self, x: torch.Tensor, layer: _DeviceLayer, c: torch.Tensor, *, centered: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The first stage's input x - c as [1, C, L] and its bias, so that conv(x) = conv(x - c) + conv(c)
        with c a per-feature level taken from the data.

        Raw price levels near 100 leave fp32 about 1e-5 of absolute resolution, and a zero-sum filter
        (a difference, a deviation from a mean) then loses most of its digits. Centering first makes
        the error scale with the moves instead of the level; conv(c) = c * (sum of taps) is folded into
        the bias in float64, and is exactly zero for zero-sum filters. ``c`` must not come from a later
        step than the outputs it touches, or causality would hold only up to rounding: the engine passes
        the last value before the chunk, or a feature's first value where it starts inside the chunk
        (outputs before that are NaN anyway).
        """
        # [1, C, L] view of a time-major buffer; zero history -> -c
        xt = (x if centered else x - c).T.unsqueeze(0)
        per_group = layer.tap_sums.shape[1]
        c64 = c.to(torch.float64).view(layer.groups, per_group)
        out_per_group = layer.tap_sums.shape[0] // layer.groups
        level = (layer.tap_sums.view(layer.groups, out_per_group, per_group) * c64[:, None, :]).sum(-1)
        bias = (layer.bias64 + level.reshape(-1)).to(torch.float32)
        return xt, bias

    def _preprocess(
        self, x: torch.Tensor, first_row: int, level: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``[preprocess]`` transform and z-score of ``x`` [L, C] in "valid" mode: [L - pre_halo, C] float32.

        Computed in float64. Rows whose global step is < pre_halo are NaN (they would need steps before
        0), and rows before step 0 are zero (the first stage's zero history). Returns the rows and the
        first stage's centering level: log(level) after "log", else 0 (the data are already small).
        """
        pre = self.pre
        p = x.to(torch.float64)
        if pre.logs:
            p = torch.where(p > 0, torch.log(p), torch.nan)
        if pre.differences:
            p = p[1:] - p[:-1]
        if pre.zscore is not None:
            p = _rolling_zscore(p, pre.zscore)
        row0 = first_row + self.pre_halo  # the global step of p's row 0
        n = p.shape[0]
        negative = min(max(-row0, 0), n)
        leading = min(max(self.pre_halo - row0, 0), n)
        if leading > negative:
            p[negative:leading] = torch.nan
        if negative:
            p[:negative] = 0.0
        if pre.transform == "log" and pre.zscore is None:
            lv = level.to(torch.float64)
            c = torch.where(lv > 0, torch.log(lv), 0.0).to(torch.float32)
        else:
            c = torch.zeros_like(level)
        return p.to(torch.float32), c


def _window_sums(q: torch.Tensor, w: int) -> torch.Tensor:
    """Sums of ``q`` [L, C] over the windows of ``w`` rows ending at rows w-1 .. L-1: [L - w + 1, C].

    Prefix sums restart every ``w`` rows, so each window is (a block's prefix) + (the previous block's
    suffix) and rounding scales with w, not with the chunk's length; each sum uses rows <= its end only.
    """
    n, c = q.shape
    nb = -(-n // w)
    blocks = torch.nn.functional.pad(q, (0, 0, 0, nb * w - n)).view(nb, w, c)
    inner = blocks.cumsum(dim=1)
    prev = torch.cat([torch.zeros_like(inner[:1]), inner[:-1]], dim=0)
    sums = inner + (prev[:, -1:, :] - prev)
    return sums.reshape(nb * w, c)[w - 1 : n]


def _rolling_zscore(p: torch.Tensor, w: int) -> torch.Tensor:
    """Causal z-score over the last ``w`` rows (population std), float64, "valid": [L - w + 1, C].

    NaN where the window holds a NaN or infinity, or where its values are all equal (std 0). Flat and
    non-finite windows are found by exact integer counts, the moments by float64 window sums of the
    values less a per-column level (the column's first finite value in ``p``, which no output before
    it can depend on).
    """
    n = p.shape[0]
    finite = torch.isfinite(p)
    first = torch.argmax(finite.to(torch.int8), dim=0)
    c = torch.where(finite.any(dim=0), p.gather(0, first[None])[0], 0.0)
    q = torch.where(finite, p - c, 0.0)
    s1 = _window_sums(q, w)
    s2 = _window_sums(q * q, w)
    zero = torch.zeros_like(p[:1], dtype=torch.int64)
    bad = torch.cat([zero, (~finite).to(torch.int64).cumsum(dim=0)])
    bad = bad[w:] - bad[: n - w + 1]  # non-finite values in rows t-w+1 .. t
    moves = torch.cat([zero, zero, (p[1:] != p[:-1]).to(torch.int64).cumsum(dim=0)])
    moves = moves[w:] - moves[1 : n - w + 2]  # changes between consecutive rows inside the window
    mean = s1 / w
    var = (s2 - s1 * mean) / w
    z = (q[w - 1 :] - mean) / torch.sqrt(var)
    return torch.where((bad > 0) | (moves == 0) | ~(var > 0), torch.nan, z)
