"""torch.nn modules over tsconv's kernels, for inference: :class:`CausalConv1d` and :class:`Pipeline`.

:class:`CausalConv1d` is one causal conv stage in torch's conv layout ([B, C, T] in, [B, O, T] out) computed by
:func:`tsconv.conv1d`: the Triton kernels on CUDA (and on CPU tensors under ``TRITON_INTERPRET=1``), torch's
``F.conv1d`` on the CPU otherwise. :class:`Pipeline` runs a resolved pipeline's stages and head on a time-major
[T, F] (or [B, T, F]) series with the engine's own compute step (:class:`tsconv.engine.compute.Backend`), so it
gives what :func:`tsconv.features` gives on the same data.

Both are inference-only: the kernels have no backward, so a call that would need gradients is refused.
Both trace under ``torch.compile`` without graph breaks: tsconv's kernels are the custom ops
``torch.ops.tsconv.conv1d`` / ``gemm`` / ``conv1d_head`` / ``filter_bank`` while compiling.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch

from tsconv.engine.compute import Backend
from tsconv.engine.fill import forward_fill_torch
from tsconv.engine.level import centering_level_torch
from tsconv.engine.options import check_warmup, refuse_time_range
from tsconv.errors import PipelineError, ShapeError, TsconvError
from tsconv.io.names import ordered_names
from tsconv.io.precision import Float32Check, exact_in_float32
from tsconv.kernels.conv1d import PRECISIONS, conv1d
from tsconv.pipeline.spec import ACTIVATIONS, WEIGHT_DTYPES, ResolvedPipeline, as_pipeline, resolve

__all__ = ["CausalConv1d", "Pipeline"]

_DTYPES = {"float16": torch.float16, "float32": torch.float32}
_CHECK_ROWS = 8192  # rows a block of the float32-rounding check copies to the host


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ShapeError(f"{name} must be a positive int, got {value!r}", hint=f"pass {name} as an int >= 1.")
    return value


def _device(device: str | torch.device) -> torch.device:
    """``device`` with its index ("cuda" is the current CUDA device), so it compares equal to a tensor's."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return d


def _refuse_grad(what: str, *tensors: torch.Tensor | None) -> None:
    """The kernels have no backward: a call that autograd would record is an error, not a silent detach."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise TsconvError(
            f"{what} is inference-only: tsconv's kernels have no backward",
            hint="call it under torch.no_grad() or torch.inference_mode(), or pass x.detach().",
        )


class CausalConv1d(torch.nn.Module):
    """A causal conv1d stage: ``act(F.conv1d(F.pad(x, ((K-1)*dilation, 0)), w, b, dilation, groups))``.

    Input [B, C, T] (torch's conv layout: channels before time; [C, T] for one series) float32 (float16 /
    bfloat16 accepted), any strides (a time-major [B, T, C] buffer is passed as ``buf.transpose(1, 2)``);
    output float32 [B, O, T]: each step depends on that step and earlier ones only. The weight is stored in
    ``weight_dtype`` (float16 by default, as in pipelines) and used at its stored values; computation is
    float32 in ``precision`` ("fp32": fp32-accurate; "tf32" / "fp16": faster tensor-core modes for normalised
    data, CUDA only: the CPU's torch path computes float32 in every mode). Inference only.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        activation: str | None = "none",
        precision: str = "fp32",
        weight_dtype: str = "float16",
        device: str | torch.device | None = None,
    ) -> None:
        """A stage with weights drawn as torch's ``nn.Conv1d`` draws them (uniform within 1/sqrt(fan-in)),
        then rounded to ``weight_dtype``; load real ones with :meth:`from_weights` or ``load_state_dict``."""
        super().__init__()
        self.in_channels = _positive("in_channels", in_channels)
        self.out_channels = _positive("out_channels", out_channels)
        self.kernel_size = _positive("kernel_size", kernel_size)
        self.dilation = _positive("dilation", dilation)
        self.groups = _positive("groups", groups)
        if in_channels % groups or out_channels % groups:
            raise ShapeError(
                f"groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}",
                hint="use groups=in_channels for a depthwise bank (out_channels a multiple of it), 1 for dense.",
            )
        self.activation = "none" if activation is None else activation
        if self.activation not in ACTIVATIONS:
            raise ShapeError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        if precision not in PRECISIONS:
            raise ShapeError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}",
                hint="'fp32' is the default and the only mode fit for raw price levels.",
            )
        self.precision = precision
        if weight_dtype not in WEIGHT_DTYPES:
            raise ShapeError(f"weight_dtype must be one of {', '.join(WEIGHT_DTYPES)}, got {weight_dtype!r}")
        bound = 1.0 / math.sqrt(in_channels // groups * kernel_size)
        shape = (out_channels, in_channels // groups, kernel_size)
        w = torch.empty(shape, device=device).uniform_(-bound, bound)
        # Parameters (state_dict, .to(), .parameters()) that never ask for gradients: inference only
        self.weight = torch.nn.Parameter(w.to(_DTYPES[weight_dtype]), requires_grad=False)
        if bias:
            b = torch.empty(out_channels, device=device).uniform_(-bound, bound)
            self.bias = torch.nn.Parameter(b, requires_grad=False)
        else:
            self.register_parameter("bias", None)

    @classmethod
    def from_weights(
        cls,
        weight: torch.Tensor | np.ndarray,
        bias: torch.Tensor | np.ndarray | None = None,
        *,
        dilation: int = 1,
        groups: int = 1,
        activation: str | None = "none",
        precision: str = "fp32",
        weight_dtype: str | None = None,
    ) -> CausalConv1d:
        """A stage holding ``weight`` [O, C/groups, K] (and ``bias`` [O]), on the weight's device.

        ``weight_dtype`` (default: float16 for a float16 weight, else float32, so given values are never
        rounded unasked) is how the weight is stored; the bias is kept as float32.
        """
        w = torch.as_tensor(weight)
        if w.dim() != 3 or not w.is_floating_point():
            raise ShapeError(
                f"weight must be a float [O, C/groups, K] tensor, got shape {list(w.shape)} {w.dtype}",
                hint="a depthwise bank of M filters per channel is [C*M, 1, K] with groups=C.",
            )
        if weight_dtype is None:
            weight_dtype = "float16" if w.dtype == torch.float16 else "float32"
        O, cg, K = (int(v) for v in w.shape)
        m = cls(cg * groups, O, K, dilation=dilation, groups=groups, bias=bias is not None, activation=activation,
                precision=precision, weight_dtype=weight_dtype, device=w.device)  # fmt: skip
        if weight_dtype == "float16" and w.abs().max() > torch.finfo(torch.float16).max:
            raise ShapeError(
                f"a weight of {float(w.abs().max()):.4g} does not fit float16",
                hint='pass weight_dtype="float32", or rescale the weights.',
            )
        with torch.no_grad():
            m.weight.copy_(w)
            if bias is not None:
                b = torch.as_tensor(bias, device=w.device)
                if tuple(b.shape) != (O,):
                    raise ShapeError(
                        f"bias must be [O] = [{O}], got {list(b.shape)}", hint="one bias per output."
                    )
                m.bias.copy_(b)
        return m

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        # copied into the float16 weight, a value past its range became inf (and every output NaN or inf),
        # where from_weights refuses it
        w = state_dict.get(prefix + "weight")
        assign = bool(args and isinstance(args[0], dict) and args[0].get("assign_to_params_buffers"))
        if (
            self.weight.dtype == torch.float16
            and not assign  # load_state_dict(..., assign=True) keeps the given tensor and its dtype
            and isinstance(w, torch.Tensor)
            and w.shape == self.weight.shape  # else torch reports the size mismatch
            and bool((torch.isfinite(w) & torch.isinf(w.detach().to(torch.float16))).any())
        ):
            raise ShapeError(
                f"{prefix}weight: a weight of {float(w.detach().abs().max()):.4g} does not fit this module's "
                "float16 weights",
                hint='build it with weight_dtype="float32" (or CausalConv1d.from_weights(..., '
                'weight_dtype="float32")), or rescale the weights.',
            )
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def weight_dtype(self) -> str:
        """How the weight is stored now ("float16" or "float32"; after ``.bfloat16()``, "bfloat16"; after
        ``.double()``, "float64", which a call refuses)."""
        return str(self.weight.dtype).removeprefix("torch.")

    @property
    def halo(self) -> int:
        """Steps before each output that it reads: (kernel_size - 1) * dilation."""
        return (self.kernel_size - 1) * self.dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, C, T] (or [C, T]) -> float32 [B, O, T] (or [O, T]), causal."""
        if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
            got = f"shape {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ShapeError(
                f"CausalConv1d expects [B, C, T] (channels before time) or [C, T], got {got}",
                hint="for a time-major [B, T, C] tensor pass x.transpose(1, 2); for one series x[None].",
            )
        if x.shape[-2] != self.in_channels:
            raise ShapeError(
                f"CausalConv1d expects {self.in_channels} channels in dim {x.dim() - 2} ([B, C, T], channels "
                f"before time), got shape {list(x.shape)}",
                hint="for a time-major [B, T, C] tensor pass x.transpose(1, 2).",
            )
        if x.device != self.weight.device:
            raise ShapeError(
                f"x is on {x.device} but the module's weights are on {self.weight.device}",
                hint=f"move the module with .to({str(x.device)!r}) or the input with x.to(...).",
            )
        if self.weight.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ShapeError(
                f"this module's weights are {self.weight_dtype} (after .double() or .to(...)); its kernels take "
                "float16, bfloat16 or float32 weights",
                hint="call .float() (or .half()) on the module.",
            )
        _refuse_grad("tsconv.nn.CausalConv1d", x, self.weight, self.bias)
        # The kernels keep rearranged weights while torch's version counter says they are unchanged; a write
        # through .data (weight.data.copy_(w): a common way to set a module's filters) does not count, and the
        # old filter's outputs came back. A copy per call is rearranged afresh (a few small kernels).
        w = self.weight.clone()
        y = conv1d(x if x.dim() == 3 else x[None], w, self.bias, dilation=self.dilation,
                   groups=self.groups, activation=self.activation, precision=self.precision)  # fmt: skip
        return y if x.dim() == 3 else y[0]

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, dilation={self.dilation}, "
            f"groups={self.groups}, bias={self.bias is not None}, activation={self.activation!r}, "
            f"precision={self.precision!r}, weight_dtype={self.weight_dtype!r}"
        )


class Pipeline(torch.nn.Module):
    """A resolved pipeline (preprocessing, conv stages, head) as a module: time-major [T, F] -> [T, D].

    ``forward`` takes a [T, F] (or [B, T, F]: B independent series) tensor whose F columns are the features
    the pipeline was resolved against, on the module's device, and returns float32 [T, D] (or [B, T, D]),
    the output columns named by :attr:`output_names`. It is :func:`tsconv.features`'s computation on the
    whole series at once, by the engine's own compute step: forward fill, the per-feature level,
    ``[preprocess]``, every stage (the first re-centred per block) and the head, warm-up rows NaN (or zero
    history with ``warmup="zero"``). On the CPU it equals ``features(x, pipeline)`` bit for bit for series of
    up to features()' ``chunk`` (65,536) steps; longer ones, and CUDA, where features() runs the batched
    engine, differ by float32 rounding only (the first stage's blocks are counted from each chunk or step of
    features(), and fall back on its level).
    The whole series is computed at once, so memory grows with T (features() streams). Inference only; the
    weights are the pipeline's (no parameters; ``.to(device)`` moves them).
    """

    def __init__(
        self,
        plan: ResolvedPipeline,
        *,
        n_features: int | None = None,
        warmup: str = "nan",
        device: str | torch.device = "cpu",
    ) -> None:
        """Prefer :meth:`from_pipeline`; ``plan`` is a pipeline resolved against ``n_features`` input
        features (default: as many as it was resolved against, which its ``input_names`` are unless a
        ``[preprocess]`` selection narrows them; another count is refused)."""
        super().__init__()
        if not isinstance(plan, ResolvedPipeline):
            raise PipelineError(
                f"Pipeline needs a resolved pipeline, got {type(plan).__name__}",
                hint="use tsconv.nn.Pipeline.from_pipeline(pipeline, input_names).",
            )
        check_warmup(warmup)
        refuse_time_range(plan, "tsconv.nn.Pipeline")
        self.plan = plan
        self.warmup = warmup
        columns = plan.columns
        # the width of x: every feature the pipeline was resolved against (a selection's columns index it)
        width = len(plan.input_names) if columns is None else plan.source_width
        if n_features is not None and width is not None and n_features != width:
            # other columns under the plan's names: 6 features through a plan of 4 gave 30 outputs, 20 named
            raise PipelineError(
                f"the pipeline was resolved against {width} features, not n_features={n_features}",
                hint="leave n_features out, or resolve the pipeline against the input's features "
                "(Pipeline.from_pipeline(pipeline, input_names)).",
            )
        self.n_features = width if n_features is None else n_features
        if self.n_features is not None and columns is not None and max(columns) >= self.n_features:
            raise PipelineError(
                f"the pipeline selects column {max(columns)} of {self.n_features} features",
                hint="pass the n_features the pipeline was resolved against.",
            )
        self._columns = None if columns is None else list(columns)
        self._fill = plan.preprocess is None or plan.preprocess.fill == "ffill"
        # each output's own warm-up rows, as the engine writes them (a bank's filters each have theirs); lists,
        # not numpy arrays, so that torch.compile indexes with constants
        self._warm = [
            (rows, None if isinstance(cols, slice) else cols.tolist()) for rows, cols in plan.warmup_groups()
        ]
        self._backend = Backend(plan, _device(device))
        # where the backend reads float32 (CUDA), rows of a dtype float32 does not hold are checked, as the
        # engines check them, until each feature is judged or the first warning
        self._rounding = Float32Check(plan.input_names)

    @classmethod
    def from_pipeline(
        cls,
        pipeline: str | os.PathLike[str] | dict[str, Any] | Any = None,
        input_names: list[str] | tuple[str, ...] | None = None,
        *,
        n_features: int | None = None,
        warmup: str = "nan",
        device: str | torch.device = "cpu",
    ) -> Pipeline:
        """The module for ``pipeline`` (a built-in's name, a TOML path, a dict, a :class:`tsconv.Pipeline`,
        None for the default, or an already resolved pipeline) bound to its input features: their names
        ``input_names`` (as :func:`tsconv.features`'s ``names``), or ``n_features`` of them named f0, f1, ..."""
        if isinstance(pipeline, ResolvedPipeline):
            if input_names is not None or n_features is not None:
                raise PipelineError(
                    "a resolved pipeline is already bound to its features",
                    hint="leave input_names and n_features out.",
                )
            return cls(pipeline, warmup=warmup, device=device)
        if (input_names is None) == (n_features is None):
            raise PipelineError(
                "from_pipeline needs the input features: input_names or n_features (one of them)",
                hint="pass input_names=['AAPL', 'MSFT'], or n_features=2 for features named f0, f1.",
            )
        if input_names is None:
            names = tuple(f"f{j}" for j in range(_positive("n_features", n_features)))
        elif (given := ordered_names(input_names)) is None:
            raise ShapeError(
                f"input_names must be an ordered list of the columns' names, got {type(input_names).__name__}: "
                f"{str(input_names)[:80]}",
                hint="input_names=['AAPL', 'MSFT'], in the order of the input's columns (a string would be "
                "read as its characters).",
            )
        else:
            names = given
        if len(set(names)) != len(names):
            raise PipelineError("input_names repeat", hint="give every feature a distinct name.")
        return cls(resolve(as_pipeline(pipeline), names), n_features=len(names), warmup=warmup, device=device)

    @property
    def device(self) -> torch.device:
        return self._backend.device

    @property
    def input_names(self) -> tuple[str, ...]:
        """The features the stages read (after ``[preprocess]`` selection)."""
        return self.plan.input_names

    @property
    def output_names(self) -> tuple[str, ...]:
        """The D output columns' names, in order (as features(..., return_names=True) gives them)."""
        return self.plan.output_names

    @property
    def halo(self) -> int:
        """The warm-up: steps before an output that it reads (NaN rows at the start with warmup="nan")."""
        return self.plan.halo

    def _apply(self, fn: Any, recurse: bool = True) -> Pipeline:
        # .to(device) / .cuda() / .cpu(): the weights live in the engine's Backend, built per device
        super()._apply(fn, recurse)
        device = _device(fn(torch.empty(0, device=self.device)).device)
        if device != self.device:
            self._backend = Backend(self.plan, device)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, F] -> float32 [T, D]; [B, T, F] -> [B, T, D] (each series on its own)."""
        if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
            got = f"shape {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ShapeError(
                f"Pipeline expects a time-major series [T, F] or a batch [B, T, F], got {got}",
                hint="one row per time step and one column per feature; for [B, C, T] pass x.transpose(1, 2).",
            )
        width = self.n_features
        if (x.shape[-1] != width) if width is not None else (x.shape[-1] <= max(self._columns or [0])):
            want = (
                f"{width} features"
                if width is not None
                else f"more than {max(self._columns or [0])} features"
            )
            raise ShapeError(
                f"Pipeline was built for {want} (the last dim), got shape {list(x.shape)}",
                hint="pass [T, F] with F the features named in from_pipeline (time-major).",
            )
        if x.device != self.device:
            raise ShapeError(
                f"x is on {x.device} but the module is on {self.device}",
                hint=f"move the module with .to({str(x.device)!r}) or the input with x.to(...).",
            )
        if x.is_complex() or x.dtype == torch.bool:
            raise ShapeError(f"expected a real numeric tensor, got {x.dtype}", hint="convert with x.float().")
        steps = x.shape[-2]
        shortest = min(self.plan.nan_rows(self.warmup), default=0)  # each output's own warm-up
        if steps == 0 or steps <= shortest:
            raise ShapeError(
                f"the series has {steps} steps but the pipeline's shortest warm-up is {shortest} steps, so every "
                "output would be NaN",
                hint=f"pass a longer series, or a shorter [preprocess] (its first {self.plan.pre_halo} steps are "
                "NaN whatever the warm-up)."
                if self.plan.pre_halo
                else "pass a longer series, or build the module with warmup='zero' for zero history.",
            )
        _refuse_grad("tsconv.nn.Pipeline", x)
        with torch.no_grad():
            if x.dim() == 2:
                y = self._series(x)
            else:
                series = [self._series(s) for s in x.unbind(0)]
                # an empty batch: [0, T, D], as CausalConv1d gives [0, O, T] (torch.stack refused no tensors)
                y = (
                    torch.stack(series)
                    if series
                    else x.new_empty((0, steps, self.plan.n_outputs), dtype=torch.float32)
                )
        if not torch.compiler.is_compiling():
            self._backend.finish()  # the FP16-storage check's warnings, once, after the first eager call
        return y

    def _check_rounding(self, x: torch.Tensor) -> None:
        """Warn where reading ``x`` (a series' selected columns, in a dtype float32 does not hold) as float32
        moves values by more than WARN_AT of their typical step (tsconv.io.precision); blocks of rows are
        copied to the host only until each feature is judged."""
        check = self._rounding
        for a in range(0, x.shape[0], _CHECK_ROWS):
            if check.done:
                return
            check.see(x[a : a + _CHECK_ROWS].cpu().numpy())

    def _series(self, x: torch.Tensor) -> torch.Tensor:
        """One series [T, F] as features() computes a series that fits one chunk (the chunked engine's first
        chunk: zero history before step 0, the level from the series itself). Rows of a dtype float32 does not
        hold (float64, integers of more than 16 bits) are read as float64 where the backend takes them (the CPU),
        as features() reads them: rounded to float32 first, prices near 1e9 in integer ticks lost up to 63 ticks
        of a one-step difference."""
        wide = not exact_in_float32(x.dtype) and self._backend.reads_float64
        if self._columns is not None:
            x = x[:, self._columns]
        if not wide and not exact_in_float32(x.dtype) and not torch.compiler.is_compiling():
            self._check_rounding(x)
        x = x.to(torch.float64 if wide else torch.float32)
        halo = self.halo
        unknown = torch.full_like(x[0], torch.nan)  # no fill state and no level before step 0
        filled = forward_fill_torch(x, unknown)
        # a level is float32 (level_before's), float64 rows' too: the level of features()' first chunk
        level = centering_level_torch(unknown.float(), filled)
        rows = torch.cat([x.new_zeros((halo, x.shape[1])), filled if self._fill else x])
        y = self._backend.run(rows, -halo, level)
        if self.warmup == "nan":
            for rows, cols in self._warm:
                if cols is None:
                    y[:rows] = torch.nan
                else:
                    y[:rows, cols] = torch.nan
        return y
