"""The last conv stage and the head of a pipeline, computed by whichever of three paths is fastest.

Paths (all float32, with tsconv's fp32-accurate kernels on CUDA):

- ``"unfused"``: the stage's conv (tsconv ``conv1d`` on CUDA, torch's ``F.conv1d`` on the CPU) into a
  [steps, O] buffer, then torch's matmul, bias and activation: the engine's path before this module.
- ``"gemm"``: the same conv, then :func:`tsconv.kernels.gemm.gemm` (``precision="fp32"``, bias and activation
  fused, head weights packed once).
- ``"fused"``: :func:`tsconv.kernels.fused.conv1d_head`: each conv tile is multiplied by the head weights on
  chip and the [steps, O] intermediate never reaches GPU memory. Offered only where the fused kernel runs
  (a dense last stage, groups = 1, within its O and D limits: :func:`tsconv.kernels.fused.fused_path`).

Choice (:class:`HeadPaths`): ``TSCONV_HEAD_PATH=unfused|gemm|fused`` forces a path (``fused`` where it is not
offered runs ``gemm``, the pair ``conv1d_head`` itself falls back to; ``gemm`` is the default: on the engine's step
shapes it measured as fast as cuBLAS or faster, and a fresh process does not pay cuBLAS's first-call
initialisation, benchmarks/NOTES.md, "The engine's head path"); ``auto`` on CUDA times
each offered path on the step's actual inputs the first time a shape class is seen (exact C, O, D, K,
dilation, groups, activations, head weight dtype, a power-of-two bucket of the step's rows, the GPU model and,
through the cache key, the Triton version) and keeps the fastest. The decision is kept in memory and in the
autotune disk cache (:func:`tsconv.kernels.autotune.store_record`), so later steps and later runs on the same
GPU model reuse it without timing. With ``TSCONV_AUTOTUNE=0`` auto keeps ``"unfused"`` without timing.

Timing: one warm call per path (it compiles and tunes the kernels for that shape class, and packs the head
weights), then the best of two rounds of three calls between CUDA events on the current stream (no
``do_bench``: it allocates a 256 MB flush buffer per call). This runs inside the engine's first step of each
shape class and synchronizes the device once per path; its outputs are discarded.

On the CPU the engine keeps the torch path, unless its backend runs the Triton kernels through the
interpreter (``TRITON_INTERPRET=1``) and a path is forced: that is how the tests run each path.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from tsconv import config
from tsconv.errors import TsconvError
from tsconv.kernels import autotune
from tsconv.kernels.torch_side import apply_activation, rows_matmul

if TYPE_CHECKING:
    from tsconv.kernels.gemm import PackedWeights

__all__ = ["PATHS", "SPACE", "HeadPaths", "can_measure", "measure_paths", "requested_path"]

log = logging.getLogger("tsconv.head")

PATHS = ("unfused", "gemm", "fused")
SPACE = "head_path_v1"  # the decisions' name in the autotune cache
_REPS = 3  # calls per timed round
_ROUNDS = 2  # timed rounds; the best counts


def requested_path() -> str | None:
    """The path the ``head_path`` setting forces (default ``gemm``), or None for ``auto``."""
    value = config.current().head_path
    return None if value == "auto" else value


def can_measure(device: torch.device) -> bool:
    """Whether auto times the paths on ``device`` (CUDA only; tests patch this)."""
    return device.type == "cuda"


def _time_path(path: str, fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds per call of ``fn`` (computing ``path``): a warm call, then the best of a few event-timed rounds.

    Tests patch this to rank the paths without timing them.
    """
    fn()  # compiles and tunes the kernels for this shape class, packs weights: not timed
    if device.type != "cuda":
        best = math.inf
        for _ in range(_ROUNDS):
            t = time.perf_counter()
            for _ in range(_REPS):
                fn()
            best = min(best, (time.perf_counter() - t) * 1e3 / _REPS)
        return best
    torch.cuda.synchronize(device)
    stream = torch.cuda.current_stream(device)
    best = math.inf
    for _ in range(_ROUNDS):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(_REPS):
            fn()
        end.record(stream)
        end.synchronize()
        best = min(best, start.elapsed_time(end) / _REPS)
    return best


class HeadPaths:
    """The last conv stage + head of a pipeline on one device, by the path chosen per shape class.

    ``weight`` [O, C/groups, K] is the stage's stored weight (float16 for the Triton kernels, else float32),
    ``head_weight`` [O, D] the head's weight for the Triton paths (float16 when its values are float16, else
    float32) and ``head_weight_torch`` the float32 one the torch matmul uses (default ``head_weight``).
    ``conv(xt, bias)`` computes the stage alone ("valid", with its activation): [1, O, steps]; default
    tsconv's ``conv1d`` in "fp32". ``triton``: offer the Triton paths ("gemm", "fused"). ``forced``: always
    this path. ``measure``: auto-select by timing (else "unfused" unless forced).
    """

    def __init__(
        self,
        *,
        weight: torch.Tensor,
        dilation: int,
        groups: int,
        activation: str | None,
        head_weight: torch.Tensor,
        head_bias: torch.Tensor | None,
        head_activation: str | None,
        head_weight_torch: torch.Tensor | None = None,
        conv: Callable[..., torch.Tensor] | None = None,  # conv(xt, bias, recenter_from=0, fallback=None)
        triton: bool = True,
        forced: str | None = None,
        measure: bool = False,
        recenter: bool = False,
        tap_sums: torch.Tensor | None = None,
    ) -> None:
        if forced is not None and forced not in PATHS:
            raise TsconvError(f"unknown head path {forced!r}", hint=f"use one of {', '.join(PATHS)}.")
        self.device = weight.device
        self.weight = weight
        self.dilation, self.groups = int(dilation), int(groups)
        self.activation = activation or "none"
        self.head_weight = head_weight
        self.head_bias = head_bias
        self.head_activation = head_activation or "none"
        self.head_weight_torch = head_weight if head_weight_torch is None else head_weight_torch
        self.O, cg, self.K = (int(v) for v in weight.shape)
        self.C = cg * self.groups
        self.D = int(head_weight.shape[1])
        self.halo = (self.K - 1) * self.dilation
        self.conv = conv if conv is not None else self._tsconv_conv
        self.recenter = recenter  # conv1d's per-block re-centering in the Triton conv paths (the first stage)
        self.tap_sums = tap_sums if recenter else None  # the sums it adds the level back with (conv1d)
        self.measure = measure and forced is None
        self.fused_reason = ""
        offered = ["unfused"]
        self._conv1d_head: Callable[..., tuple[torch.Tensor, ...]] | None = None
        self._gemm: Callable[..., torch.Tensor] | None = None
        self._pack: Callable[..., PackedWeights] | None = None
        if triton:
            # the Triton kernel modules only where their paths are offered (a CPU run may lack Triton),
            # imported once here rather than per step
            from tsconv.kernels.fused import conv1d_head, fused_path
            from tsconv.kernels.gemm import gemm, pack_weights

            self._conv1d_head, self._gemm, self._pack = conv1d_head, gemm, pack_weights
            offered.append("gemm")
            probe = torch.zeros((1, self.C, self.halo + 1), device=self.device)
            ok, self.fused_reason = fused_path(
                probe, weight, head_weight, groups=self.groups, padding="valid", dilation=self.dilation
            )
            if ok:
                offered.append("fused")
        self.offered: tuple[str, ...] = tuple(offered)
        self.forced = forced
        if forced is not None and forced not in self.offered:
            # conv1d_head's own fallback is conv1d + gemm; without Triton paths, the torch pair
            self.forced = "gemm" if forced == "fused" and "gemm" in self.offered else "unfused"
            log.info("head path %s is not offered here (%s): %s", forced, self.fused_reason, self.forced)
        self._gpu = autotune.device_label(self.device)
        self._packed: PackedWeights | None = None
        self._chosen: dict[int, str] = {}  # rows bucket -> path
        self.timings: dict[str, dict[str, float]] = {}  # key -> ms per path, for decisions timed here
        self.rows: dict[str, int] = {}  # rows computed per path

    # ------------------------------------------------------------------------------------------ choice

    @property
    def path(self) -> str | None:
        """The path that computed the most rows so far (None before the first call)."""
        return max(self.rows, key=self.rows.__getitem__) if self.rows else None

    def key(self, rows: int) -> str:
        """The shape class of a step of ``rows`` output rows (the cache adds the Triton version)."""
        return (
            f"C={self.C}|O={self.O}|D={self.D}|K={self.K}|dil={self.dilation}|g={self.groups}"
            f"|act={self.activation}|hact={self.head_activation}|hw={str(self.head_weight.dtype)[6:]}"
            f"|rows={autotune.pow2_bucket(rows)}|gpu={self._gpu}"
        )

    def choose(
        self,
        xt: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        recenter_from: int = 0,
        fallback: torch.Tensor | None = None,
    ) -> str:
        """The path for this step's input ``xt`` [1, C, halo + steps] and conv ``bias``; may time the paths."""
        if self.forced is not None:
            return self.forced
        if not self.measure:
            return "unfused"
        bucket = autotune.pow2_bucket(xt.shape[-1] - self.halo)
        path = self._chosen.get(bucket)
        if path is None:
            path = self._decide(self.key(xt.shape[-1] - self.halo), xt, bias, recenter_from, fallback)
            self._chosen[bucket] = path
        return path

    def _decide(
        self,
        key: str,
        xt: torch.Tensor,
        bias: torch.Tensor | None,
        recenter_from: int = 0,
        fallback: torch.Tensor | None = None,
    ) -> str:
        rec = autotune.cached_record(SPACE, key, device=self.device)
        if rec is not None and rec.get("config") in self.offered:
            return str(rec["config"])
        if not autotune.tuning_enabled():
            return "unfused"
        t0 = time.perf_counter()
        timings = self.measure_all(xt, bias, recenter_from=recenter_from, fallback=fallback)
        finite = {p: ms for p, ms in timings.items() if math.isfinite(ms)}
        if not finite:
            return "unfused"  # every path failed: the plain path raises its error where the engine sees it
        best = min(finite, key=finite.__getitem__)
        self.timings[key] = timings
        record = {
            "config": best,
            "ms": finite[best],
            "timings_ms": {p: (ms if math.isfinite(ms) else None) for p, ms in timings.items()},
            "tune_s": round(time.perf_counter() - t0, 3),
            "rows": int(xt.shape[-1] - self.halo),
        }
        autotune.store_record(SPACE, key, record, device=self.device)
        log.info("head path for [%s]: %s (%s)", key, best, record["timings_ms"])
        return best

    def measure_all(
        self,
        xt: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        recenter_from: int = 0,
        fallback: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Milliseconds per call of each offered path on these inputs (inf where a path fails)."""
        timings: dict[str, float] = {}
        for p in self.offered:
            try:
                timings[p] = float(
                    _time_path(
                        p,
                        lambda p=p: self.compute(p, xt, bias, recenter_from=recenter_from, fallback=fallback),
                        self.device,
                    )
                )
            except Exception as exc:  # noqa: BLE001 - a path that cannot run (resources, ...) is not chosen
                log.warning("head path %s failed while timing: %s", p, exc)
                timings[p] = math.inf
        return timings

    # ----------------------------------------------------------------------------------------- compute

    def run(
        self,
        xt: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        recenter_from: int = 0,
        fallback: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``head_act(act(conv_valid(xt) + bias) @ W + b)``: [steps, D] float32 for ``xt`` [1, C, halo + steps]
        (``recenter_from``: leading rows of zero history, ``fallback``: each channel's level where a block's
        samples are not finite, for conv1d's recentering)."""
        path = self.choose(xt, bias, recenter_from=recenter_from, fallback=fallback)
        out = self.compute(path, xt, bias, recenter_from=recenter_from, fallback=fallback)
        self.rows[path] = self.rows.get(path, 0) + int(out.shape[0])
        return out

    def compute(
        self,
        path: str,
        xt: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        recenter_from: int = 0,
        fallback: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The step by ``path`` (one of :attr:`offered`): [steps, D] float32."""
        if path == "fused":
            assert self._conv1d_head is not None  # offered only with the Triton paths
            return self._conv1d_head(
                xt,
                self.weight,
                bias,
                self.head_weight,
                self.head_bias,
                dilation=self.dilation,
                groups=self.groups,
                padding="valid",
                activation=self.activation,
                head_activation=self.head_activation,
                precision="fp32",
                recenter=self.recenter,
                recenter_from=recenter_from,
                tap_sums=self.tap_sums,
                recenter_fallback=fallback if self.recenter else None,
            )[0]
        y = self.conv(xt, bias, recenter_from=recenter_from, fallback=fallback)[0].T  # [steps, O]
        if path == "gemm":
            assert self._gemm is not None and self._pack is not None  # offered only with the Triton paths
            if self._packed is None:
                self._packed = self._pack(self.head_weight, "fp32")
            return self._gemm(
                y, self._packed, self.head_bias, activation=self.head_activation, precision="fp32"
            )
        out = rows_matmul(y, self.head_weight_torch)
        if self.head_bias is not None:
            out += self.head_bias
        return apply_activation(out, self.head_activation)

    def _tsconv_conv(
        self,
        xt: torch.Tensor,
        bias: torch.Tensor | None,
        recenter_from: int = 0,
        fallback: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from tsconv.kernels.conv1d import conv1d

        return conv1d(
            xt,
            self.weight,
            bias,
            dilation=self.dilation,
            groups=self.groups,
            padding="valid",
            activation=self.activation,
            precision="fp32",
            recenter=self.recenter,
            recenter_from=recenter_from,
            tap_sums=self.tap_sums,
            recenter_fallback=fallback if self.recenter else None,
        )


def measure_paths(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    head_weight: torch.Tensor,
    head_bias: torch.Tensor | None = None,
    *,
    dilation: int = 1,
    groups: int = 1,
    activation: str | None = None,
    head_activation: str | None = None,
) -> dict[str, object]:
    """For benchmarks: the path auto picks for an engine-shaped step, and each path's time measured now.

    ``x`` is [1, C, halo + steps] (a time-major buffer's transposed view, as the engine passes it), computed
    in "valid" mode. Returns ``{"pick": path, "source": "cache" | "timed", "timings_ms": {path: ms},
    "offered": [...], "fused_reason": str}``; the pick comes from the decision cache when it holds one.
    Call it with TF32 off for torch's matmul (the engine does).
    """
    hp = HeadPaths(
        weight=weight,
        dilation=dilation,
        groups=groups,
        activation=activation,
        head_weight=head_weight,
        head_bias=head_bias,
        head_activation=head_activation,
        head_weight_torch=head_weight.float(),
        measure=True,
    )
    pick = hp.choose(x, bias)
    key = hp.key(x.shape[-1] - hp.halo)
    timed = key in hp.timings
    timings = hp.timings[key] if timed else hp.measure_all(x, bias)
    return {
        "pick": pick,
        "source": "timed" if timed else "cache",
        "timings_ms": {p: (ms if math.isfinite(ms) else None) for p, ms in timings.items()},
        "offered": list(hp.offered),
        "fused_reason": hp.fused_reason,
    }
