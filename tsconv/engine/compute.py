"""The compute step of the engine: one chunk through every stage and the head.

On the CPU each stage is torch's ``F.conv1d`` in tiles of fixed shape, one thread each
(:func:`~tsconv.kernels.torch_side.conv1d_cpu`: the same bits on any thread count, as the head's
``rows_matmul``); on CUDA it is tsconv's Triton ``conv1d`` (fp32-accurate,
FP16-stored weights upcast in the kernel, bias and activation fused, time-major in and out, so nothing
is transposed or padded). Chunks arrive time-major with their halo, and stages run in "valid" mode.
A ``[preprocess]`` transform and z-score run first, as torch ops in float64 on the same device, also in
"valid" mode over the preprocessing's ``pre_halo`` rows. The last stage and the head run by one of three
paths (torch matmul, tsconv's gemm, or the fused conv -> head kernel), on CUDA the fastest as measured on
first use of a shape class (:mod:`tsconv.engine.head`; ``TSCONV_HEAD_PATH`` forces one).
"""

from __future__ import annotations

import functools
import threading
import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tsconv.errors import TsconvWarning
from tsconv.kernels import torch_side
from tsconv.kernels.cpu_tiles import one_thread
from tsconv.kernels.filterbank import bank_halo, filter_bank, window_moments
from tsconv.kernels.torch_side import apply_activation, conv1d_cpu, rows_matmul
from tsconv.pipeline.filters import Filter
from tsconv.pipeline.spec import ResolvedPipeline

__all__ = ["CHECK_ROWS_MIN", "Backend", "ShortCallSample"]


@dataclass(frozen=True)
class _DeviceLayer:
    # the stored values: float16 for the Triton kernel, else float32; None for a bank
    weight: torch.Tensor | None
    # [O, C/groups] float64: sum over taps of each filter as given (before FP16 rounding), which the level
    # is added back with: rounding then never adds level x (rounded sum - true sum) to the outputs
    tap_sums: torch.Tensor
    bias: torch.Tensor | None  # float32
    bias64: torch.Tensor  # [O] float64 (zeros without bias)
    dilation: int
    groups: int
    halo: int
    activation: str
    filters: tuple[Filter, ...] | None = None  # a built-in bank, computed from its filters' definitions


def _conv_layer(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    layer: _DeviceLayer,
    triton: bool,
    recenter: bool = False,
    recenter_from: int = 0,
    fallback: torch.Tensor | None = None,
) -> torch.Tensor:
    """act(conv_valid(x, w) + bias) for x [1, C, L] (any strides); returns [1, O, L - halo].

    ``recenter``: conv1d's per-block re-centering (the first stage on levels), with ``recenter_from``
    leading rows of zero history and ``fallback`` [C] each channel's level where a block's samples are not
    finite (None: 0); the level is added back with the exact tap sums of the weights as given."""
    if triton:
        from tsconv.kernels.conv1d import conv1d

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
            tap_sums=layer.tap_sums if recenter else None,
            recenter_fallback=fallback if recenter else None,
        )
    if recenter:
        y = _conv_recentered(x, bias, layer, recenter_from, fallback=fallback)
        return apply_activation(y, layer.activation)
    y = conv1d_cpu(x, layer.weight, bias, dilation=layer.dilation, groups=layer.groups)
    return apply_activation(y, layer.activation)


# Output rows per re-centred block on the CPU (at least the halo, so a block's input is at most twice its
# outputs). Why blocks: a chunk centred on one level leaves x - level as large as the series' drift over
# the chunk, and FP16-stored weights then move a zero-sum filter's outputs by drift x (rounding of each
# tap). For a random zero-sum dense conv (32 -> 16 channels, K = 5) on a 20,000-step price walk, relative
# to the output's scale: 1.8e-2 with one level per chunk, 1.5e-3 / 1.0e-3 / 6.9e-4 / 5.2e-4 with blocks
# of 64 / 32 / 16 / 8 rows (float32 weights: 1.4e-5 per chunk, 4.8e-7 in blocks).
_CPU_BLOCK = 16
# Samples of x a block's level is the median of: the block's first output step and the steps just before it, on
# the CPU as in the Triton kernels (common.level). Five, so that two bad prints in a row among them are never the
# level (of three, two were: every output of that block whose window did not hold them lost up to 60% of its
# scale; the dense kernels read one, and one print of 1e8 there put that block's outputs hundreds of times their
# scale off).
_LEVEL_SAMPLES = 5
# Built-in filters by how a shift c of their input moves them: f(x + c) = f(x) + c, or f(x + c) = f(x)
_SHIFTED = frozenset({"id", "lag", "ma", "ema"})
_UNMOVED = frozenset({"diff", "dev", "std", "zscore"})


def _conv_recentered(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    layer: _DeviceLayer,
    recenter_from: int,
    *,
    weight: torch.Tensor | None = None,
    tap_sums: torch.Tensor | None = None,
    block: int = _CPU_BLOCK,
    threaded: bool = False,
    fallback: torch.Tensor | None = None,
) -> torch.Tensor:
    """conv_valid(x, w) + bias for x [1, C, L] on the CPU, each block of output rows computed as
    conv(x - v) + v * (exact tap sums): the torch twin of conv1d's ``recenter``. ``v`` per channel and
    block is the median of x at the block's first output step and the four steps before it (a sample
    that is not finite, or before row 0, counts as ``fallback`` [C], the engine's level of the chunk (None:
    0); samples in the leading ``recenter_from`` rows of zero history move to the first data row), so it
    is causal and one or two bad prints in a row are never a block's level. A float64 ``x`` is rounded to
    float32 after each block's level is off. ``weight`` and ``tap_sums`` replace the layer's
    (the FP16 storage check runs the rounding residual this way). ``threaded``: the conv on torch's own
    threads rather than in fixed tiles (the check's estimate, whose bits reach no output: its sample of a
    thousand rows made two tiles, so a 4096-feature first stage took 0.6 s more of a GPU run's report)."""
    weight = layer.weight if weight is None else weight
    tap_sums = layer.tap_sums if tap_sums is None else tap_sums
    _, C, L = x.shape
    halo = layer.halo
    n_out = L - halo
    block = max(block, halo)
    # At least two blocks: torch's CPU conv takes another algorithm for a batch of one, whose rounding differs,
    # and a block's outputs must not depend on how many blocks a call holds (a Stream's short pushes).
    nb = max(2, -(-n_out // block))
    xp = F.pad(x, (0, nb * block - n_out))
    rows = torch.arange(nb) * block + halo  # each block's first output step, as an input row
    # a sample before the input's first row counts as the call's level (the engine's, a median of the rows
    # before the chunk): clamped to row 0, it counted that row twice, and one bad print there (a chunk's halo of
    # one row) was the block's level; taken as the block's own step, two prints in a row across a chunk's edge
    # (its last row and the next one's first) were too
    picks = torch.stack([rows - k for k in range(_LEVEL_SAMPLES)])
    before = picks < 0
    picks = picks.clamp(min=min(recenter_from, L - 1), max=L - 1)
    samples = x[0][:, picks]  # [C, samples, nb]
    fb = 0.0 if fallback is None else fallback.to(x.dtype)[:, None, None]
    samples = torch.where(torch.isfinite(samples) & ~before, samples, fb)
    v = samples.median(dim=1).values  # [C, nb]
    blocks = xp[0].unfold(1, block + halo, block)  # [C, nb, block + halo], a view
    xb = (blocks - v[:, :, None]).permute(1, 0, 2).to(weight.dtype)  # [nb, C, block + halo]
    conv = F.conv1d if threaded else conv1d_cpu
    y = conv(xb, weight, None, dilation=layer.dilation, groups=layer.groups)  # [nb, O, block]
    g = layer.groups
    o_g, c_g = tap_sums.shape[0] // g, tap_sums.shape[1]
    # per block, as the conv: its bits depend on neither the number of blocks nor the thread count
    levels = v.to(tap_sums.dtype).view(g, c_g, nb).transpose(1, 2)  # [g, nb, c_g]
    addback = rows_matmul(levels, tap_sums.view(g, o_g, c_g).transpose(1, 2)).permute(0, 2, 1)  # [g, o_g, nb]
    addback = addback.reshape(g * o_g, nb)
    if bias is not None:
        addback = addback + bias.to(addback.dtype)[:, None]
    y = y + addback.T.to(y.dtype)[:, :, None]
    return y.permute(1, 0, 2).reshape(1, -1, nb * block)[..., :n_out]


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
        # values, exactly), made once here rather than per chunk. Banks hold no weights.
        def stored(L) -> torch.Tensor | None:  # noqa: ANN001
            if L.structured:
                return None
            half = L.weight_dtype == "float16" and self.triton
            return put(L.weight, torch.float16 if half else torch.float32)

        self.layers = tuple(
            _DeviceLayer(
                weight=stored(L),
                tap_sums=put(L.tap_sums, torch.float64),
                bias=put(L.bias),
                bias64=put(L.bias if L.bias is not None else np.zeros(L.out_channels), torch.float64),
                dilation=L.dilation,
                groups=L.groups,
                halo=L.halo,
                activation=L.activation,
                filters=L.filters,
            )
            for L in plan.layers
        )
        pre = plan.preprocess
        self.pre = pre if pre is not None and pre.computes else None
        self.pre_halo = plan.pre_halo
        # Level data (raw values, or their logs): the first stage re-centres per block of outputs (conv1d's
        # ``recenter`` in the Triton kernels, _conv_recentered on the torch path), so the error follows the
        # moves a block sees, not the level or a chunk's drift (NOTES.md, "Precision"). The same rule as the
        # level _preprocess returns.
        self.recenter_first = plan.first_on_levels
        self.first_structured = plan.layers[0].structured
        # Whether a chunk's level is read at all: by the first stages that re-centre (a conv on level data:
        # raw values, whose blocks fall back on it, or their logs, which _preprocess centres on it), and by
        # no other.
        self.reads_level = self.recenter_first
        self.head = plan.head
        self._storage = _StorageCheck(plan) if _StorageCheck.needed(plan) else None
        self._check_rows = 0 if self._storage is None else _StorageCheck.rows_wanted(plan)
        self._checking: list[_StorageCheck] = []  # started, their warnings not yet given
        # Rows of the next calls' input, from its first, that hold data: a batched run computes a short last
        # step at full size, and its rows past the data are stale or never written (None: every row). The
        # FP16-storage check samples these rows only.
        self.valid_rows: int | None = None
        # the run's last step + 1, where the engine knows it (the FP16 check's last sample; a Stream: None)
        self.series_end: int | None = None
        # The fewest output rows a check may sample: one, unless the calls are pieces of a series that goes on
        # (a Stream's pushes: one-row pushes had the check judge an output's scale from a single row)
        self.min_check_rows = 1
        self._warned: set[str] = set()  # the stages warned of
        # Where a list (a dask task's), the FP16-storage check's warnings land there as (stage, move, message)
        # for the client to give once a stage, instead of each task giving its own.
        self.notes: list[tuple[str, float, str]] | None = None
        self.head_weight = put(plan.head.weight) if plan.head else None
        self.head_bias = put(plan.head.bias) if plan.head else None
        # A bank as the last stage runs alone, then the head as torch's matmul (the "unfused" path).
        last_bank = bool(self.layers) and self.layers[-1].filters is not None
        self._head = (
            self._head_paths(plan) if plan.head is not None and self.layers and not last_bank else None
        )
        # A bank's head: tsconv's gemm where the Triton paths run (the head_path setting's default; "unfused"
        # keeps torch's matmul), as for a conv stage's head; None without a bank head.
        self._bank_head = self._bank_head_path() if plan.head is not None and last_bank else None
        self._bank_head_rows = 0
        self._packed_head = None
        # width of run()'s result where it can be written into a caller's ``out`` (a bank, no head), else None
        self.out_width = plan.n_outputs if last_bank and plan.head is None else None
        # Whether a call's outputs are the same bits however the rows are split into calls: banks only (each
        # output a fixed sequence of operations over its own window, filterbank's module note), no computing
        # [preprocess] (its z-score works in blocks counted from the call's first row) and no head.
        self.call_invariant = (
            all(L.filters is not None for L in self.layers) and self.pre is None and plan.head is None
        )
        # a CPU call of a pipeline with a dense stage holds torch on one thread (_held)
        self._dense_cpu = (
            device.type == "cpu" and not self.triton and any(L.filters is None for L in self.layers)
        )
        # Whether float64 input rows reach the pipeline as they are (the engines then read them so): on the
        # CPU's torch path a bank's arithmetic is float64 from the values it is given, [preprocess] computes in
        # float64, and a first stage of weights subtracts its level from them before its float32 arithmetic
        # (_first_stage_input), so a float64 input loses nothing to a float32 read. The Triton paths read
        # float32 (tsconv.io.precision says where that matters).
        self.reads_float64 = not self.triton
        # Log levels for a first stage that is a bank on the Triton path (float32 rows): its columns that move
        # with a shift of their input (id, lag, ma, ema) get the level added back after the bank, the others
        # (diff, dev, std, zscore) do not see it, so the rows can be centred in float64 before the rounding;
        # ret (not shift-invariant) or an activation leave the bank on the rounded logs
        # (output columns, their features)
        self._level_columns: tuple[torch.Tensor, torch.Tensor] | None = None
        first = self.layers[0] if self.layers else None
        if (
            self.triton
            and self.pre is not None
            and self.pre.log_levels
            and first is not None
            and first.filters is not None
            and first.activation == "none"
            and all(f.kind in _SHIFTED | _UNMOVED for f in first.filters)
        ):
            m, shifted = len(first.filters), [j for j, f in enumerate(first.filters) if f.kind in _SHIFTED]
            c = plan.layers[0].in_channels
            # integer indices, made here: a step graph may not sync on a mask's nonzero, nor copy to the device
            self._level_columns = (
                torch.tensor(
                    [k * m + j for k in range(c) for j in shifted], dtype=torch.int64, device=device
                ),
                torch.tensor([k for k in range(c) for _ in shifted], dtype=torch.int64, device=device),
            )
            self.reads_level = True  # the level the rows are centred on

    def _head_paths(self, plan: ResolvedPipeline):  # noqa: ANN202 - HeadPaths, imported lazily
        """The last stage + head by the measured-fastest path on CUDA (see :mod:`tsconv.engine.head`).

        On the CPU: the torch path, unless Triton runs interpreted here and ``TSCONV_HEAD_PATH`` forces one.
        """
        from tsconv.engine import head

        forced = head.requested_path()
        measure = forced is None and head.can_measure(self.device)
        active = self._triton_head(forced is not None or measure)
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
            tap_sums=last.tap_sums,
            forced=forced if active else None,
            measure=active and measure,
        )

    def _triton_head(self, chosen: bool) -> bool:
        """Whether a head runs on the Triton paths: on CUDA; on the CPU only through the interpreter, and
        only where a path was ``chosen`` (forced or timed), as the tests run each path."""
        return self.triton and (self.device.type == "cuda" or (torch_side.INTERPRETED and chosen))

    def _bank_head_path(self) -> str:
        from tsconv.engine import head

        forced = head.requested_path()
        return "gemm" if self._triton_head(forced is not None) and forced != "unfused" else "unfused"

    @property
    def window_lookback(self) -> int:
        """Rows before its first output that a call from :meth:`window_start` may need: at most halo + 2 x
        the blocks' alignment (what a stream keeps between pushes)."""
        return self.halo + 2 * self._alignment()

    def window_start(self, chunk_row: int, row: int) -> int:
        """The input row where a call computing a chunk's outputs from step ``row`` on starts, so that they
        equal, bit for bit on the CPU, those of one call over the whole chunk, whose input starts at
        ``chunk_row`` (the chunk's first step less the halo).

        The re-centred first stage works in blocks counted from the call's first row: the start is on the
        chunk's block grid, at most halo + block - 1 rows before ``row``. A re-centring
        block's level reads the four steps before it, so with a first stage of a shorter halo the call starts
        one block earlier (the block holding ``row`` then has them; the
        earlier one's outputs are dropped).
        """
        a = self._alignment()
        start = chunk_row + (row - self.halo - chunk_row) // a * a
        if self.recenter_first:
            # the rows a block's level reads before its first output step: the Triton kernels step by the
            # dilation, the CPU's blocks by one row
            reach = (_LEVEL_SAMPLES - 1) * (self.layers[0].dilation if self.triton else 1)
            if (short := reach - self.layers[0].halo) > 0:
                start = max(chunk_row, start - -(-short // a) * a)
        return start

    def _alignment(self) -> int:
        align = 1
        if self.recenter_first:
            align = max(_CUDA_BLOCK if self.triton else _CPU_BLOCK, self.layers[0].halo)
        return align

    @property
    def head_path(self) -> str | None:
        """How the last stage and the head were computed ("unfused", "gemm" or "fused": the path of most
        rows so far); None without a head or before the first chunk."""
        if self._head is not None:
            return self._head.path
        return self._bank_head if self._bank_head_rows else None

    @torch.no_grad()
    def finish(self) -> None:
        """Give the FP16-storage check's warnings (waiting for it if it still runs); call at a run's end."""
        checking, self._checking = self._checking, []
        for check in checking:
            for what, move, message in check.wait():
                if what not in self._warned:  # once per stage, from the earliest check that saw it
                    self._warned.add(what)
                    if self.notes is not None:
                        self.notes.append((what, move, message))
                    else:
                        warnings.warn(message, TsconvWarning, stacklevel=2)

    def run(
        self,
        x: torch.Tensor,
        first_row: int,
        level: torch.Tensor,
        *,
        zscore_level: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Compute outputs for a chunk.

        ``x`` is [halo + n, C] float32 (or float64 where :attr:`reads_float64`), time-major, whose row 0 is
        global step ``first_row`` (negative
        for the first chunks, where those rows are the zero history). ``level`` [C] is a finite value
        per feature known no later than the feature's first value in the chunk (see ``_first_stage``).
        Returns [n, D] float32.

        ``zscore_level`` [C] float64 (``[preprocess] zscore`` only): the z-score's per-column level, NaN
        where not known yet, completed in place from this call's rows. A caller computing one chunk's rows
        in several calls (:class:`tsconv.engine.stream.Stream`) passes the same tensor to each, so every call
        uses the level the whole chunk would; None: this call's own (the chunked engine).

        ``out`` [n, D] (contiguous float32 on the device): where a pipeline whose last stage is a bank with
        no head writes its result (the returned tensor is then ``out``); other pipelines ignore it.
        """
        with self._held():
            valid = self.valid_rows
            if self.pre is not None:
                x, level, centered = self._preprocess(x, first_row, level, zscore_level)
                first_row += self.pre_halo
                valid = None if valid is None else valid - self.pre_halo
            else:
                centered = False
            return self._stages(x, first_row, level, centered=centered, out=out, valid=valid)

    def _held(self) -> AbstractContextManager[object]:
        """For an eager CPU call of a pipeline with a dense stage: torch on one thread for the whole call, its
        convolutions and products in tiles over the process's threads (:mod:`tsconv.kernels.cpu_tiles`).
        With torch's threads between them, its OpenMP threads spun beside the tiles' after each parallel
        element-wise op: 100,000 x 64 through a [64 -> 64, K 16] stage, a [64 -> 32, K 5] stage and a head took
        0.42 s in 1,024-row chunks on the 2-core VM, held 0.28-0.31 s (0.30 and 0.25 s in 16,384-row chunks).
        A bank's own element-wise ops are larger: held, a bank pipeline ran 10-60% slower, so it is not."""
        if not self._dense_cpu or torch.compiler.is_compiling():
            return nullcontext()
        return one_thread()

    def check_storage(self, x: torch.Tensor, first_row: int, level: torch.Tensor, *, centered: bool) -> None:
        """Start the FP16-storage check on the stage input ``x`` (as :meth:`_stages` takes it, only rows that
        hold data) where one is due. :meth:`_stages` calls it; a caller that replays the stages' launches
        (the batched engine's CUDA graph runs no Python of them) calls it for each replayed step."""
        # Beside eager calls only: its thread and host copies cannot be traced by torch.compile (tsconv.nn's
        # modules), which sees the stages alone.
        if torch.compiler.is_compiling():
            return
        check = self._storage
        if check is not None:
            if check.start(self, x, first_row, level, centered=centered):
                self._checking.append(check)
                self._storage = check.again(self.series_end)
            elif check.needless:
                self._storage = None
        if self._checking and all(c.done() for c in self._checking) and not _capturing(x):
            self.finish()

    def storage_check_state(self) -> tuple[Any, ...]:
        """The FP16-storage check's progress, for a caller that takes a call back (a Stream's push that
        raised): :meth:`restore_storage_check` makes the next calls check and warn as that call would have
        (a warning made an error left the check done, and the same rows pushed again went unwarned)."""
        s = self._storage  # not started: a started check is replaced by its next one (check_storage)
        how = None if s is None else (s.plan, s.after, s.times, s.previous, s.end)
        return how, list(self._checking), set(self._warned)

    def restore_storage_check(self, state: tuple[Any, ...]) -> None:
        """Put the FP16-storage check back as :meth:`storage_check_state` found it."""
        how, checking, warned = state
        if how is None:
            self._storage = None
        else:
            plan, after, times, previous, end = how
            self._storage = _StorageCheck(plan, after=after, times=times, previous=previous, end=end)
        self._checking, self._warned = checking, warned

    @property
    def storage_check_pending(self) -> bool:
        """Whether the FP16-storage check (or a later one) may still start on a call's rows."""
        return self._storage is not None

    @property
    def check_rows(self) -> int:
        """Output rows the FP16-storage check samples first where a call has them (0: no check)."""
        return self._check_rows

    @torch.no_grad()
    def check_storage_of(
        self,
        x: torch.Tensor,
        first_row: int,
        level: torch.Tensor,
        *,
        zscore_level: torch.Tensor | None = None,
    ) -> None:
        """Start the FP16-storage check on rows ``x`` as :meth:`run` takes them, computing no outputs: for a
        caller whose calls are each too short to be judged (a Stream's small pushes), on rows it gathered
        over several calls. ``zscore_level`` is not changed."""
        if self._storage is None:
            return
        centered = False
        if self.pre is not None:
            known = None if zscore_level is None else zscore_level.clone()
            x, level, centered = self._preprocess(x, first_row, level, known)
            first_row += self.pre_halo
        self.check_storage(x, first_row, level, centered=centered)

    def _stages(
        self, x: torch.Tensor, first_row: int, level: torch.Tensor, *, centered: bool,
        out: torch.Tensor | None = None, valid: int | None = None,
    ) -> torch.Tensor:  # fmt: skip
        self.check_storage(x if valid is None else x[:valid], first_row, level, centered=centered)
        start = first_row
        y = None
        last = len(self.layers) - 1
        history = min(max(-first_row, 0), x.shape[0])  # leading rows before step 0: zero history
        for i, layer in enumerate(self.layers):
            if layer.filters is not None:
                shift = i == 0 and centered and self._level_columns is not None
                if i == 0:  # time-major [L, C]; a centred input gets its level back (the GPU engine
                    # does not centre a pipeline whose first stage is a bank), after the bank where it can
                    src = x + level if centered and not shift else x
                else:
                    src = y[0].T
                into = out if i == last and self.head is None else None
                res = filter_bank(src, layer.filters, dilation=layer.dilation, activation=layer.activation,
                                  triton_kernels=self.triton, out=into)  # fmt: skip
                if shift:
                    cols, feature = self._level_columns
                    res[:, cols] += level.to(res.dtype)[feature]
                if i == last:
                    return res if self.head is None else self._head_matmul(res)
                y = res.T.unsqueeze(0)
                start += layer.halo
                if start < 0:
                    y[..., : min(-start, y.shape[-1])] = 0.0
                continue
            fallback = None
            if i == 0:
                y, bias, fallback = self._first_stage_input(x, layer, level, centered=centered)
            else:
                bias = layer.bias
            first = i == 0 and self.recenter_first
            if i == last and self._head is not None:
                # the last stage and the head, by the chosen path
                return self._head.run(
                    y, bias, recenter_from=history if i == 0 else 0, fallback=fallback if first else None
                )
            y = _conv_layer(
                y,
                bias,
                layer=layer,
                triton=self.triton,
                recenter=first,
                recenter_from=history if first else 0,
                fallback=fallback if first else None,
            )
            start += layer.halo
            # Each stage pads its own input with zeros (F.pad semantics): rows before step 0 are zero
            # history for the next stage, not this stage's response to the previous zeros.
            if start < 0 and i + 1 < len(self.layers):
                y[..., : min(-start, y.shape[-1])] = 0.0
        return y[0].T

    def _head_matmul(self, y: torch.Tensor) -> torch.Tensor:
        """``act(y @ W + b)`` for a bank's output ``y`` [steps, O]."""
        self._bank_head_rows += int(y.shape[0])
        if self._bank_head == "gemm":
            from tsconv.kernels.gemm import gemm, pack_weights

            if self._packed_head is None:
                self._packed_head = pack_weights(self.head_weight, "fp32")
            return gemm(
                y, self._packed_head, self.head_bias, activation=self.head.activation, precision="fp32"
            )
        out = rows_matmul(y, self.head_weight)
        if self.head_bias is not None:
            out += self.head_bias
        return apply_activation(out, self.head.activation)

    def _first_stage(
        self, x: torch.Tensor, layer: _DeviceLayer, c: torch.Tensor, *, centered: bool = False
    ) -> torch.Tensor:
        """The first stage on ``x`` as the engine computes it (see :meth:`_first_stage_input`)."""
        xt, bias, fallback = self._first_stage_input(x, layer, c, centered=centered)
        # (tests: no history rows)
        return _conv_layer(
            xt, bias, layer=layer, triton=self.triton, recenter=self.recenter_first, fallback=fallback
        )

    def _first_stage_input(
        self, x: torch.Tensor, layer: _DeviceLayer, c: torch.Tensor, *, centered: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The first stage's input as [1, C, L], its bias and the level its re-centring falls back on.

        Raw price levels near 100 leave fp32 about 1e-5 of absolute resolution, and a zero-sum filter (a
        difference, a deviation from a mean) would lose most of its digits: a first stage on levels is
        re-centred per block of outputs (conv1d's ``recenter``, :func:`_conv_recentered` on the CPU), each
        block computing conv(x - v) + v * (sum of taps) with v the block's own level, so the error scales
        with the moves a block sees. Where a block has no finite sample of a feature (a symbol that starts
        trading inside it), v is the chunk's level ``c`` (the fallback returned): the rows before the chunk,
        else the feature's first value in it, so causality holds (outputs before that value are NaN).
        ``x`` reaches the blocks as it is: taking ``c`` off a whole chunk first rounded every row that moved
        more than about 2x from ``c`` (a coin tripling within a chunk, a 20 -> 500 ramp) at the level's
        resolution, which no block could give back (1.1e-5 of a difference's scale on the CPU, 1.2e-5 on
        the GPU's steps). A ``centered`` input (log levels centred in float64 by :meth:`_preprocess`) is
        already x - c: its blocks fall back on 0, and conv(c) = c * (sum of taps) joins the bias in float64.
        Float64 rows (the CPU's) stay float64 until each block's level is off.
        """
        per_block = self.recenter_first and not self.triton
        xt = x if x.dtype == torch.float64 and per_block else x.to(torch.float32)
        xt = xt.T.unsqueeze(0)  # [1, C, L] view of a time-major buffer
        if not centered:
            return xt, layer.bias64.to(torch.float32), c
        per_group = layer.tap_sums.shape[1]
        c64 = c.to(torch.float64).view(layer.groups, per_group)
        out_per_group = layer.tap_sums.shape[0] // layer.groups
        level = (layer.tap_sums.view(layer.groups, out_per_group, per_group) * c64[:, None, :]).sum(-1)
        bias = (layer.bias64 + level.reshape(-1)).to(torch.float32)
        return xt, bias, None

    def _preprocess(
        self, x: torch.Tensor, first_row: int, level: torch.Tensor, zscore_level: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The ``[preprocess]`` transform and z-score of ``x`` [L, C] in "valid" mode: [L - pre_halo, C] float32
        (float64 for log levels where :attr:`reads_float64`).

        Computed in float64. Rows whose global step is < pre_halo are NaN (they would need steps before
        0), and rows before step 0 are zero (the first stage's zero history). Returns the rows, the
        first stage's centering level: log(level) after "log", else 0 (the data are already small), and
        whether the rows are already centred on it.
        """
        pre = self.pre
        p = x.to(torch.float64)
        if pre.logs:
            p = torch.where(p > 0, torch.log(p), torch.nan)
        if pre.differences:
            p = p[1:] - p[:-1]
        if pre.zscore is not None:
            # p's rows before the first step whose value is the data's own (rows of the zero history, and a
            # difference taken across its end) do not choose the z-score's level
            own = 1 if pre.differences else 0
            history = min(max(own - (first_row + pre.differences), 0), p.shape[0])
            # float32 rows need no level: float64 window sums of them lose less than float32 keeps (a float32
            # value's moves are at least its ulp), and without one each z-score depends on its window alone
            # (any chunking, a huge print far away); wider rows (float64, int64 near 1e12) are centred on one
            centre = x.dtype != torch.float32
            p = _rolling_zscore(
                p, pre.zscore, known=zscore_level if centre else None, history=history, centre=centre
            )
        row0 = first_row + self.pre_halo  # the global step of p's row 0
        n = p.shape[0]
        negative = min(max(-row0, 0), n)
        leading = min(max(self.pre_halo - row0, 0), n)
        if leading > negative:
            p[negative:leading] = torch.nan
        if negative:
            p[:negative] = 0.0
        if pre.log_levels:
            lv = level.to(torch.float64)
            c = torch.where(lv > 0, torch.log(lv), 0.0).to(torch.float32)
            if self.reads_float64:
                # Log levels stay float64 where the stages take float64 rows (a bank computes from them, a first
                # stage of weights subtracts its level first): rounded to float32 here, log(100) kept 2.4e-7 of
                # absolute resolution, and a diff:1 of log prices moving 1e-4 a step was off by 2.5e-3 of its
                # scale (log_return: 4e-8)
                return p, c, False
            if self.layers and (self.layers[0].filters is None or self._level_columns is not None):
                # float32 stages (Triton): a first stage of weights, or a bank that adds the level back where
                # it moves its output (_level_columns), takes its rows centred, so they are centred here in
                # float64 and rounded after, keeping the moves' digits, not the level's
                return (p - c.to(torch.float64)).to(torch.float32), c, True
        else:
            c = torch.zeros_like(level)
        return p.to(torch.float32), c, False


def _rolling_zscore(
    p: torch.Tensor, w: int, *, known: torch.Tensor | None = None, history: int = 0, centre: bool = True
) -> torch.Tensor:
    """Causal z-score over the last ``w`` rows (population std), float64, "valid": [L - w + 1, C].

    NaN where the window holds a NaN or infinity, or where its values are all equal (std 0). Flat and
    non-finite windows are found by exact integer counts, the moments by the banks' pairwise window sums
    and sums of squared deviations (:func:`~tsconv.kernels.filterbank.window_moments`: a one-pass
    ``s2 - s1 * mean`` cancelled where a window's moves are small against its distance from the level)
    of the values less a per-column level: the median of the first window in ``p`` whose ``w`` values are
    all finite and none of the first ``history`` rows (those stand for steps before the data; of two values,
    the smaller in magnitude). Every output that is not NaN comes at or after that window, so the level is
    causal; a median, so that one huge print in that window does not become it (as a level 1e30 would leave
    no digit to the chunk's other z-scores). NaN also where the window's variance overflows float64.
    ``known`` [C] float64: levels already chosen (NaN: none yet), used and completed in place.
    ``centre`` False: no level (the values as they are).
    """
    n = p.shape[0]
    finite = torch.isfinite(p)
    zero = torch.zeros_like(p[:1], dtype=torch.int64)
    bad = torch.cat([zero, (~finite).to(torch.int64).cumsum(dim=0)])
    bad = (bad[w:] - bad[: n - w + 1]) > 0  # a non-finite value in rows t-w+1 .. t
    if centre:
        full = ~bad
        full[: min(history, full.shape[0])] = False  # windows reaching into the zero history
        seen = full.any(dim=0)
        if full.shape[0]:
            first = torch.argmax(full.to(torch.int8), dim=0)
            rows = first[None] + torch.arange(w, device=p.device)[:, None]
            win = p.gather(0, rows)
            if w == 2:  # torch's median of two is the lower one: a print of -1e30 would be it
                mid = torch.where(win[0].abs() <= win[1].abs(), win[0], win[1])
            else:
                mid = win.median(dim=0).values
            c = torch.where(seen, mid, 0.0)
        else:
            c = torch.zeros_like(p[0])
        del full
        if known is not None:
            c = torch.where(torch.isnan(known), c, known)
            known.copy_(torch.where(torch.isnan(known) & seen, c, known))
        q = torch.where(finite, p - c, 0.0)
    else:
        q = torch.where(finite, p, 0.0)
    s1, m2 = window_moments(q, w)
    moves = torch.cat([zero, zero, (p[1:] != p[:-1]).to(torch.int64).cumsum(dim=0)])
    flat = (moves[w:] - moves[1 : n - w + 2]) == 0  # no change between consecutive rows inside the window
    del moves
    mean = s1 / w
    var = m2 / w
    z = (q[w - 1 :] - mean) / torch.sqrt(var)
    # a variance past float64's range (values beyond about 1e154) would make every z-score 0: NaN instead
    return torch.where(bad | flat | ~(var > 0) | torch.isinf(var), torch.nan, z)


# A stage whose FP16-stored weights move its outputs by more than this share of their scale gets a warning.
FP16_WARN = 1e-3
# The check sees the first chunk only; over a whole series the error grows past what its rows showed (over
# 8000 steps of levels 20..500, dense, grouped and depthwise zero-sum convs reached 0.7x-1.4x of the sampled
# figure, 1.3x for a dense conv at 1.04e-3 sampled at 8.0e-4). So it warns from half of FP16_WARN.
_WARN_FROM = FP16_WARN / 2
# Output rows of the first chunk the check computes: as many as _CHECK_MACS multiply-adds allow (about 0.1 s
# on one core), between 128 and 1024. The largest error over a sample grows with its length: on 8000 steps of
# price levels 20..500, four zero-sum grouped convs (8 channels a group) moved by 1.1e-3 to 1.25e-3 of their
# scale went unwarned with 128 rows, and were warned with 1024 (those within 5% of 1e-3 still go unwarned).
_CHECK_ROWS = (128, 1024)
CHECK_ROWS_MIN = _CHECK_ROWS[0]  # the rows a check samples at least where a call may be short (Stream)
_CHECK_MACS = 100_000_000
# Where an input feature has fewer than _CHECK_ROWS[0] finite, moving values over a check's rows (a symbol not
# yet listed, a stale quote under a zero-sum filter), the outputs it reaches are not judged there: a later chunk
# is checked too (beside the first, from the data alone), from a row at
# least twice as far into the series (a check costs at most about 0.1 s of one core, beside the run), up to
# this many times in all. One check alone missed moves of 2.3e-3 to 0.81 of the scale, unwarned, where the
# first 1,024 rows held a symbol that started at row 3,000.
_CHECK_TIMES = 32
# Samples the first check takes from its chunk: the first rows, then shorter ones (a quarter as long, 128 rows at
# least) spread over the rest of the chunk. A later check takes its first rows only: with the spread, the later
# checks of a store whose late symbols kept them coming (about ten over a million rows) took 0.09 s of a 0.47 s
# report on an H100 (store a: 0.38-0.40 s without them), their torch ops on every core beside the decode threads.
_CHECK_SPREAD = 4
# The recentering block the check assumes on CUDA: the dense kernels' largest fp32 time tile.
_CUDA_BLOCK = 128


class ShortCallSample:
    """The FP16-storage check's sample where each call is too short to hold one (a Stream's small pushes, a run at
    a ``--chunk`` below the rows the check samples): the calls' input rows are gathered until they hold as many
    output rows as the check samples, then the check starts on them. Judged on each call alone, a one-row push
    was never checked, and a --chunk 1 run of ``dense_head`` warned that storage moved an output by 1.7e-3 of
    its scale "on 1 rows sampled" (the scale of one row), where the whole series had under 4e-4.

    The caller sets ``backend.min_check_rows`` so that the backend does not judge short calls itself. What is
    gathered is kept as copies (a reader reuses its buffers, a user their push's array) and replaced, never
    changed in place, so that :meth:`state` is a snapshot a Stream restores after a failed push."""

    def __init__(self, backend: Backend, halo: int) -> None:
        self.backend, self.halo = backend, halo
        self._rows: tuple[np.ndarray, ...] = ()  # the first call's input, then each later call's new rows
        self._first = self._end = 0  # the global steps of the gathered rows' first and of the row after them

    def see(
        self,
        x: np.ndarray,
        first: int,
        new: np.ndarray,
        level: np.ndarray | torch.Tensor,
        *,
        zscore_level: torch.Tensor | None = None,
    ) -> None:
        """A call's input ``x`` from global step ``first`` (its halo and any history included), ``new`` its
        rows after those, and the ``level`` (and ``zscore_level``) it ran with."""
        backend = self.backend
        end = first + x.shape[0]
        if (
            not backend.storage_check_pending
            or x.shape[0] - max(0, -first) - self.halo >= backend.min_check_rows
        ):
            self._rows = ()  # no check to come, or this call was sampled (or refused for a reason rows do not change)
            return
        if not self._rows or self._end != end - new.shape[0] or self._rows[0].dtype != x.dtype:
            self._rows, self._first = (x.copy(),), first
        else:
            self._rows = (*self._rows, new.copy())
        self._end, self._level, self._zscore_level = end, level, zscore_level
        if end - self._first - max(0, -self._first) - self.halo >= backend.check_rows:
            self._start()

    def flush(self) -> None:
        """Offer the rows gathered since the last sample to the check with its own rules (at a run's end: a
        short series is judged on all its rows, as one call of them would be)."""
        if self._rows and self.backend.storage_check_pending:
            self._start()

    def state(self) -> tuple[Any, ...]:
        """What :meth:`see` changes, for :meth:`restore`."""
        return self._rows, self._first, self._end

    def restore(self, state: tuple[Any, ...]) -> None:
        """Back to a :meth:`state`."""
        self._rows, self._first, self._end = state

    def _start(self) -> None:
        rows, self._rows = np.concatenate(self._rows, axis=0), ()
        dev = self.backend.device
        level = self._level if isinstance(self._level, torch.Tensor) else torch.from_numpy(self._level)
        self.backend.check_storage_of(
            torch.from_numpy(rows).to(dev), self._first, level.to(dev), zscore_level=self._zscore_level
        )


# (pinned copy, device tensor) pairs of finished checks, freed by the run's thread (_release_finished)
_FINISHED: list[tuple[torch.Tensor | None, torch.Tensor | None]] = []


def _capturing(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _release_finished() -> None:
    """Free the buffers finished checks left: called by the run's thread, outside a CUDA graph capture."""
    if _FINISHED and not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        _FINISHED.clear()


class _StorageCheck:
    """How far FP16 storage moves each stage's (and the head's) outputs on the data at hand, warned once.

    On the first chunk with enough data rows, 128 to 1024 output rows (``_CHECK_ROWS``; fewer for larger
    pipelines) and shorter samples spread over the rest of the chunk (``_CHECK_SPREAD``), and later chunks' first
    rows alone where an input could not judge the outputs (``_CHECK_TIMES``): each stage's output is computed with its weights as given (its scale; the centred first
    stage as the engine computes it, so that a zero-sum filter on raw levels keeps its low digits), and the
    change that rounding made is that stage's conv with the rounding residual (for the centred first stage
    block by block, as the engine re-centres), compared per output with the largest finite value of the
    output; a stage with later ones (or a head) is judged too by the move its rounding makes in the
    pipeline's outputs, carried through them (:meth:`_carried`), against those outputs' scale. In float32
    (the residual is small, so its product is exact enough), on the CPU whatever the
    engine's device: on CUDA, torch's conv and matmul would load cuBLAS (or cuDNN) into a batch job whose
    own kernels are Triton's, hundreds of milliseconds of a fresh process, where the CPU needs at most
    about a tenth of a second (``_CHECK_MACS``): it runs in a thread beside the run (torch's CPU ops
    release the GIL) and its warnings are given by :meth:`Backend.finish`. Stages stored in float32, or
    whose weights float16 holds exactly, cost nothing.
    """

    def __init__(
        self, plan: ResolvedPipeline, *, after: int | None = None, times: int = 1,
        previous: _StorageCheck | None = None, end: int | None = None,
    ) -> None:  # fmt: skip
        """``after``: the first step a chunk it may start on begins at (None: any); ``times``: which check
        this is; ``previous``: the check before it, whose sample (on the device) decides whether this one
        is needed; ``end``: the series' last step + 1, for the last check, which starts on the chunk that
        reaches it and samples that chunk's last rows."""
        self.plan = plan
        self.after, self.times, self.end = after, times, end
        self.previous = previous
        self.needless = False  # the previous check's sample judged every output: this one never starts
        self.sparse = False  # an input feature had too few finite, moving values over the rows sampled
        # on CUDA: ``sparse``, there once ``_copied`` has passed
        self._sparse_host: torch.Tensor | None = None
        self._row = 0  # the global step of the rows checked
        self._sizes: list[int] = []  # the rows of each sample, halo included
        self._thread: threading.Thread | None = None
        self._copied: torch.cuda.Event | None = None  # when the stage input has reached host memory
        self._keep: torch.Tensor | None = None  # the device tensor being copied, alive until then
        self._host: torch.Tensor | None = None  # its pinned copy
        self._messages: list[tuple[str, float, str]] = []
        self._error: BaseException | None = None

    @staticmethod
    def rows_wanted(plan: ResolvedPipeline) -> int:
        """Output rows a check samples first where the chunk has them: as many as ``_CHECK_MACS``
        multiply-adds allow, between ``_CHECK_ROWS[0]`` and ``_CHECK_ROWS[1]``."""
        macs = sum(L.out_channels * L.weight.shape[1] * L.taps for L in plan.layers)
        if plan.head is not None:
            macs += plan.head.weight.size
        return max(_CHECK_ROWS[0], min(_CHECK_ROWS[1], _CHECK_MACS // max(1, macs)))

    @staticmethod
    def needed(plan: ResolvedPipeline) -> bool:
        """Whether any stage (or the head) stores its weights as float16. Whether float16 holds them
        exactly is found in the check's thread: comparing megabytes of weights here would delay the run."""
        dtypes = [L.weight_dtype for L in plan.layers if not L.structured]
        if plan.head is not None:
            dtypes.append(plan.head.weight_dtype)
        return "float16" in dtypes

    def start(
        self, backend: Backend, x: torch.Tensor, first_row: int, level: torch.Tensor, *, centered: bool
    ) -> bool:
        """Start the check on this chunk's stage input ``x`` [L, C] (row 0 is global step ``first_row``);
        False when it has too few data rows (try the next chunk) or a CUDA graph is being captured."""
        if _capturing(x) or (self.after is not None and first_row < self.after):
            return False
        if self.end is not None and first_row + x.shape[0] < self.end - self.rows_wanted(self.plan):
            return False  # the last check: a chunk within a sample of the end (a short last chunk is not one)
        if self.previous is not None:
            wanted = self.previous.judged_sparse()
            if wanted is None:  # its sample has not reached the host yet: a later step asks again
                return False
            self.previous = None
            if not wanted:
                self.needless = True
                return False
        _release_finished()
        plan = self.plan
        halo = sum(layer.halo for layer in plan.layers)
        a = max(0, -first_row)  # the first data row: earlier rows are zero history
        m = min(self.rows_wanted(plan), x.shape[0] - a - halo)
        # the last check judges each output's scale from its sample: a few rows of a short last chunk warned
        # of 3.9e-3 where the error was 2.5e-4
        least = _CHECK_ROWS[0] if self.end is not None else 1
        if m < max(least, backend.min_check_rows):
            return False
        if self.end is not None:  # the last check: the series' last rows, where a symbol listed late trades
            a = max(a, x.shape[0] - halo - m)
        self._row = first_row + a
        # the first m rows, and up to _CHECK_SPREAD - 1 shorter samples spread over the rest of the chunk: one
        # long chunk (features() takes 65,536 rows at once) whose first rows could not judge an output (a
        # symbol listed later, a stale opening quote) holds rows that can
        starts, sizes = [a], [halo + m]
        rest = x.shape[0] - (a + halo + m)  # rows after the first sample
        m2 = max(_CHECK_ROWS[0], m // _CHECK_SPREAD)
        if rest >= halo + m2 and self.times == 1:
            span = rest - (halo + m2)
            for k in range(1, _CHECK_SPREAD):
                starts.append(a + halo + m + span * k // (_CHECK_SPREAD - 1))
                sizes.append(halo + m2)
        self._sizes = sizes
        u = torch.cat([x[s : s + n] for s, n in zip(starts, sizes, strict=True)])
        # Float64 rows (the CPU's reading of float64 and wide-integer inputs) stay float64 where the first stage
        # is re-centred: _conv_recentered rounds them once each block's level is off, as the engine does.
        # Rounded here first, a cumulative volume near 1e12 moving 1,000 a step became a staircase of 131,072
        # (float32's ulp there), and the outputs' scale measured on it left a 3e-3 move unwarned.
        wide = u.dtype == torch.float64 and not u.is_cuda and backend.recenter_first and not centered
        if not wide:
            u = u.float()
        # decided from the inputs, not from when this check's thread ends; on CUDA the flag is copied with the
        # sample and read by the next check once the copy has landed (judged_sparse), a step or so later
        moving = torch.isfinite(u[1:]) & (u[1:] != u[:-1])
        sparse = (moving.sum(dim=0) < _CHECK_ROWS[0]).any()
        if not u.is_cuda:
            self.sparse = bool(sparse)
        if centered:
            u = u + level.float()
        # the first stage's level, as a last row copied with the sample: the engine centres on it before each
        # block's own level, so the rounding's error is computed on the same centred rows
        u = torch.cat([u, level.to(u.dtype).reshape(1, -1).to(u.device)])
        if u.is_cuda:
            # An asynchronous copy (a blocking one would stall the run's stream), made on the run's stream
            # after ``u``'s own work; the check's thread waits for it.
            self._keep = u
            host = torch.empty(u.shape, dtype=u.dtype, pin_memory=True)
            host.copy_(u, non_blocking=True)
            self._sparse_host = torch.empty((), dtype=torch.bool, pin_memory=True)
            self._sparse_host.copy_(sparse, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()
            self._host, u = host, None
        else:
            u = u.clone()  # the run may reuse x's memory
        block = _CUDA_BLOCK if backend.triton else _CPU_BLOCK
        args = (u, backend.layers, block, backend.recenter_first)
        self._thread = threading.Thread(
            target=self._guarded, args=args, name="tsconv-fp16-check", daemon=True
        )
        self._thread.start()
        return True

    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def again(self, end: int | None = None) -> _StorageCheck | None:
        """The next check, once this one has started, where its inputs could not judge every output (it runs
        beside this one: where it starts depends on the data alone). On CUDA whether they could is known
        when the sample's copy is: the next check asks (:meth:`judged_sparse`) before it starts. ``end``: the
        series' last step + 1 where known: once the next check would start past it, a last one samples the
        series' last rows (a symbol listed after the last check's rows was never judged: 1.5e-3 of a dense
        output's scale went unwarned where 2,700 rows of 8,000 followed the last check, at --chunk 1024)."""
        on_device = self._sparse_host is not None
        if self.times >= _CHECK_TIMES or self.end is not None or not (self.sparse or on_device):
            return None
        after = max(2 * self._row, self._row + 1)
        last = end is not None and after >= end
        return _StorageCheck(
            self.plan, after=self._row + 1 if last else after, times=self.times + 1,
            previous=self if on_device else None, end=end if last else None,
        )  # fmt: skip

    def judged_sparse(self) -> bool | None:
        """Whether an input feature had too few finite, moving values over this check's sample (so that a
        later check is needed); on CUDA None until the sample's copy, which an earlier step queued, is done
        (waiting for it held the run's thread behind that step's compute; with that wait the re-checks cost
        0.21 s of a 0.89 s report on an H100, benchmarks/NOTES.md)."""
        if self._sparse_host is not None:
            if not self._copied.query():
                return None
            self.sparse = bool(self._sparse_host)
            _FINISHED.append(
                (self._sparse_host, None)
            )  # pinned: freed by the run's thread, outside a capture
            self._sparse_host = None
        return self.sparse

    def wait(self) -> list[tuple[str, float, str]]:
        """The warnings (the stage, its move relative to the output's scale, the message), once the check has
        finished; re-raises an error it met."""
        if self._thread is not None:
            self._thread.join()
        _release_finished()
        if self._error is not None:
            raise self._error
        return self._messages

    def _guarded(self, *args: object) -> None:
        try:
            self._evaluate(*args)  # type: ignore[arg-type]
        except BaseException as e:  # noqa: BLE001 - handed to the run's thread by wait()
            self._error = e
        finally:
            # Freed by the run's thread, never here: a pinned block freed while the run's thread captures
            # a CUDA graph on the stream that copied into it can get its free event recorded into the
            # capture, and a later pinned allocation that polls that event fails (pytorch/pytorch#193982
            # describes the device allocator's form of it).
            if self._host is not None or self._keep is not None:
                _FINISHED.append((self._host, self._keep))
                self._host = self._keep = None

    @torch.no_grad()
    def _evaluate(
        self, u: torch.Tensor, layers: tuple[_DeviceLayer, ...], block: int, recenter: bool
    ) -> None:
        if self._copied is not None:
            self._copied.synchronize()
            u = self._host.clone()  # pageable: the pinned block stays with the run's thread
        plan = self.plan
        # the rounding residuals (given - stored), float32, None where there is none (and for banks,
        # which compute from their filters' definitions, storing nothing)
        residuals = [
            None if L.structured else _residual(L.weight_dtype, L.weight, L.given) for L in plan.layers
        ]
        head = plan.head
        head_residual = None if head is None else _residual(head.weight_dtype, head.weight, head.given)
        if all(r is None for r in residuals) and head_residual is None:
            return  # float16 holds every stored weight exactly
        noted: dict[tuple[str, bool], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        named: dict[tuple[str, bool], tuple[str, ...]] = {}
        level, u = u[-1], u[:-1]
        for part in torch.split(u, self._sizes):
            for what, carried, err, exact, names in self._moves(
                part, level, layers, residuals, head_residual, block, recenter
            ):
                errs, exacts = noted.setdefault((what, carried), ([], []))
                errs.append(err)
                exacts.append(exact)
                named[what, carried] = names
        # the pipeline's outputs first: a stage is warned once, with the figure of what the user gets
        for what, carried in sorted(noted, key=lambda k: not k[1]):
            errs, exacts = noted[what, carried]
            self._note(torch.cat(errs), torch.cat(exacts), what, named[what, carried], carried=carried)

    def _moves(
        self, u: torch.Tensor, level: torch.Tensor, layers: tuple[_DeviceLayer, ...],
        residuals: list[np.ndarray | None], head_residual: np.ndarray | None, block: int, recenter: bool,
    ) -> list[tuple[str, bool, torch.Tensor, torch.Tensor, tuple[str, ...]]]:  # fmt: skip
        """For each stage (and the head) storage rounds: its name, whether the move is the pipeline's outputs'
        (else the stage's own), what the rounding moved those outputs by and those outputs with the weights as
        given, [rows, outputs], and those outputs' names (``<stage>.<o>``, or the pipeline's), over one sample
        ``u`` [halo + rows, C] whose first stage the engine centres on ``level`` [C]. A stage before others gets
        both: its own outputs' move, and the pipeline's outputs' move that its rounding alone makes through every
        later stage and the head."""
        plan = self.plan
        moves = []
        y = u.T.unsqueeze(0)  # [1, C, L]
        origin = plan.pipeline.origin
        inputs, pres, own = [], [], {}  # each stage's input and output before its activation; the moves
        for i, (layer, dl, res) in enumerate(zip(plan.layers, layers, residuals, strict=True)):
            inputs.append(y)
            if layer.structured:
                out = filter_bank(y[0].T, layer.filters, dilation=layer.dilation, triton_kernels=False)
                out = out.T.unsqueeze(0)
                pres.append(out if layer.activation in (None, "none") else out.clone())
                y = apply_activation(out, layer.activation)
                continue
            bias = None if layer.bias is None else torch.from_numpy(layer.bias).float()
            # The scale: each stage's output with the weights as given (what the outputs should be), the
            # centred first stage computed as the engine does. The stored weights' sums differ from the
            # given ones, and a zero-sum filter's output on raw levels then carried level x (that
            # difference), many times its scale: the check saw the scale inflated and warned too little.
            given = torch.from_numpy(layer.given).float()
            # A block with no finite sample of a feature (a symbol that lists inside it, one before the sample's
            # first row) falls back on the engine's level, as the engine's blocks do: on 0, a cumulative volume
            # near 1e12 listed late was taken raw in float32, the outputs' scale came out 100x too large and a
            # move of 2.5e-3 of it went unwarned
            fallback = torch.nan_to_num(level, nan=0.0)
            if i == 0 and recenter:
                # the layer's tap sums live on the engine's device; the check runs on the CPU
                sums = torch.from_numpy(layer.tap_sums)
                out = _conv_recentered(
                    y, bias, dl, 0, weight=given, tap_sums=sums, block=block, threaded=True, fallback=fallback
                )
            else:
                out = F.conv1d(y, given, bias, dilation=layer.dilation, groups=layer.groups)
            pres.append(out if layer.activation in (None, "none") else out.clone())
            if res is not None:
                dw = torch.from_numpy(res)
                if i == 0 and recenter:
                    # block by block as the engine, falling back on its level: a symbol that starts inside a
                    # block has no level of that block's own, and its raw price there (0) put 100x the engine's
                    # error in the figure
                    zeros = torch.zeros(dl.tap_sums.shape, dtype=torch.float32)
                    err = _conv_recentered(
                        y,
                        None,
                        dl,
                        0,
                        weight=dw,
                        tap_sums=zeros,
                        block=block,
                        threaded=True,
                        fallback=fallback,
                    )
                else:
                    err = F.conv1d(y, dw, dilation=layer.dilation, groups=layer.groups)
                own[i] = (f"{origin}: [[conv]] #{i + 1} ({layer.name})", err)
            y = apply_activation(out, layer.activation)
            if res is not None:
                # the stage's outputs are after its activation: their move, over their scale (the move before
                # it, over the scale after it, warned of a saturated tanh stage that storage moves not at all)
                moved = _activation_move(pres[i], err, layer.activation)
                names = tuple(f"{layer.name}.{o}" for o in range(layer.out_channels))
                moves.append((own[i][0], False, moved[0].T, y[0].T, names))
        # the head's outputs as given, after its bias and activation (what the user gets): without the bias,
        # a head that subtracts a level (a bias of -100 over prices) was judged on a scale of 100 where its
        # outputs' is 1, and a move of 6.6% of their scale went unwarned
        h = y[0].T
        head = head_pre = None
        final = h
        if plan.head is not None:
            head = torch.from_numpy(plan.head.given).float()
            head_pre = h @ head
            if plan.head.bias is not None:
                head_pre = head_pre + torch.from_numpy(plan.head.bias).float()
            final = apply_activation(head_pre.clone(), plan.head.activation)
        for i, (what, err) in own.items():
            if i + 1 < len(plan.layers) or head is not None:
                moves.append(
                    (
                        what,
                        True,
                        self._carried(i, err, inputs, pres, head, head_pre),
                        final,
                        plan.output_names,
                    )
                )
        if head_residual is not None:
            moved = _activation_move(head_pre, h @ torch.from_numpy(head_residual), plan.head.activation)
            moves.append((f"{origin}: [head]", False, moved, final, plan.output_names))
        return moves

    def _carried(
        self, i: int, err: torch.Tensor, inputs: list[torch.Tensor], pres: list[torch.Tensor],
        head: torch.Tensor | None, head_pre: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        """The move of the pipeline's outputs, [rows, outputs], that stage ``i``'s move ``err`` [1, O, L] makes
        through the later stages (their weights as given) and the head (``head_pre``: its outputs as given
        before its activation). A stage's own move, over its own outputs' scale, hid what later stages show: a
        5-step weighted mean of prices, moved by 6e-7 of the price, then differenced, left the outputs 1.7e-3 of
        their scale off, unwarned. The move itself is carried through linear steps (small, so float32 keeps it to its own digits); activations and the
        bank's non-linear filters take the difference of two runs in float64, from the outputs as given."""
        layers = self.plan.layers
        d = _activation_move(pres[i], err, layers[i].activation)
        for j in range(i + 1, len(layers)):
            layer = layers[j]
            if layer.structured:
                d = _bank_move(layer.filters, layer.dilation, inputs[j], d)
            else:
                given = torch.from_numpy(layer.given).float()
                d = F.conv1d(d, given, dilation=layer.dilation, groups=layer.groups)
            d = _activation_move(pres[j], d, layer.activation)
        if head is None:
            return d[0].T
        return _activation_move(head_pre, d[0].T @ head, self.plan.head.activation)

    def _note(self, err: torch.Tensor, exact: torch.Tensor, what: str, names: tuple[str, ...], *,
              carried: bool = False) -> None:  # fmt: skip
        """Keep a warning when ``err`` [rows, outputs] exceeds ``_WARN_FROM`` of each output's scale (its largest
        finite |value| in ``exact``), naming the worst output by its name in ``names`` (``carried``: the
        pipeline's: an output column), once a stage."""
        if any(w == what for w, _, _ in self._messages):
            return
        finite = torch.isfinite(exact) & torch.isfinite(err)
        scale = torch.where(finite, exact.abs(), 0.0).amax(dim=0)
        moved = torch.where(finite, err.abs(), 0.0).amax(dim=0)
        rel = torch.where(scale > 0, moved / scale, 0.0)
        worst = int(torch.argmax(rel))
        if float(rel[worst]) > _WARN_FROM:
            whose = "the pipeline's " if carried else ""
            self._messages.append((what, float(rel[worst]),
                f"{what}: storing its weights as float16 moves {whose}output {names[worst]!r} by up to {float(rel[worst]):.1e} "
                f"of its scale on {err.shape[0]} rows sampled from this data (longer spans can move it further, "
                f'past {FP16_WARN:.0e}); set weight_dtype = "float32" for it (or use weights that float16 '
                "holds exactly, such as power-of-two windows)",
            ))  # fmt: skip


# Filters that are linear in their input: a move carried through them is the filter of the move.
_LINEAR_FILTERS = frozenset({"id", "lag", "diff", "ma", "dev", "ema"})


def _activation_move(pre: torch.Tensor, d: torch.Tensor, activation: str | None) -> torch.Tensor:
    """How far ``activation`` moves its output where its input ``pre`` (as given) moves by ``d``: in float64,
    since ``pre`` may hold price levels whose float32 spacing is coarser than ``d``."""
    if activation in (None, "none"):
        return d
    p = pre.double()
    return (apply_activation(p + d, activation) - apply_activation(p.clone(), activation)).float()


def _bank_move(filters: tuple[Filter, ...], dilation: int, x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The move [1, C x M, L - halo] of a bank's outputs where its input ``x`` [1, C, L] moves by ``d``: the
    linear filters of ``d``, the others' difference of two runs on float64 inputs (ret, std, zscore)."""
    channels, m = x.shape[1], len(filters)
    n = x.shape[2] - bank_halo(filters, dilation)
    out = torch.empty((n, channels, m), dtype=torch.float32)
    linear = [k for k, f in enumerate(filters) if f.kind in _LINEAR_FILTERS]
    other = [k for k in range(m) if k not in linear]
    if linear:
        part = filter_bank(d[0].T, tuple(filters[k] for k in linear), dilation=dilation, triton_kernels=False)
        out[:, :, linear] = part[part.shape[0] - n :].reshape(n, channels, len(linear))
    if other:
        fs = tuple(filters[k] for k in other)
        x64 = x[0].T.double()
        moved = filter_bank(x64 + d[0].T, fs, dilation=dilation, triton_kernels=False)
        part = moved - filter_bank(x64, fs, dilation=dilation, triton_kernels=False)
        out[:, :, other] = part[part.shape[0] - n :].reshape(n, channels, len(other))
    return out.reshape(n, channels * m).T.unsqueeze(0)


def _residual(dtype: str, stored: np.ndarray, given: np.ndarray) -> np.ndarray | None:
    """given - stored as float32 for an FP16-stored weight that float16 does not hold exactly, else None."""
    if dtype != "float16" or np.array_equal(stored, given):
        return None
    return (given - stored.astype(np.float64)).astype(np.float32)
