"""What the kernels' torch paths share with their Triton launchers; imports no Triton.

A CPU run (and any host without Triton) computes with these alone: the activations on tensors
(``apply_activation``, which every torch path uses, so that all paths agree exactly), TF32 rounding of weights
(``round_tf32_torch``, as ``round_tf32`` rounds in the kernels), the tap sums of ``recenter=True``
(``recenter_sums``), the cache of rearranged weights (``WEIGHTS``) and ``custom_op``, which registers the
torch ops that ``torch.compile`` sees in place of the kernels' calls.

``INTERPRETED`` says whether the Triton kernels run through Triton's interpreter (CPU tensors then run them);
modules read it at call time, so tests can switch it off. ``require_triton`` is the one check that Triton
can be imported, for the callers that are about to run its kernels.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from tsconv import config
from tsconv.errors import TsconvError
from tsconv.kernels.cpu_tiles import run_tiles
from tsconv.kernels.weight_cache import WeightCache

__all__ = [
    "INTERPRETED",
    "WEIGHTS",
    "apply_activation",
    "conv1d_cpu",
    "custom_op",
    "recenter_sums",
    "require_triton",
    "round_tf32_torch",
    "rows_matmul",
]

# TRITON_INTERPRET=1 has to be set before the first @triton.jit runs (tests set it at start-up), so the
# setting read once here is the one the kernel modules are defined under.
INTERPRETED = config.interpreted()

# The rearranged weights of recent calls (tsconv.kernels.weight_cache): a steady-state call with the same
# weights launches no rearranging kernels. conv1d and the fused kernel share it (the same dense layout,
# rearranged once for both).
WEIGHTS = WeightCache(16)


def require_triton(what: str) -> None:
    """Raise :class:`~tsconv.errors.TsconvError` (one line for the CLI) when Triton cannot be imported;
    ``what`` names what needs it (e.g. ``"device cuda"``)."""
    try:
        importlib.import_module("triton")
    except ImportError as exc:
        raise TsconvError(
            f"{what} needs Triton (pip install triton), which cannot be imported here ({exc})",
            hint="Triton publishes Linux wheels only; without it use --device cpu.",
        ) from None


def custom_op(name: str, module: str) -> Callable[[Callable], object]:
    """``torch.library.custom_op(name, mutates_args=())``, applied at the top level of ``module``.

    torch asks :mod:`inspect` for the module that registers an op. inspect's first lookup of a file reads
    ``__file__`` of every module in ``sys.modules``, and that imports the lazily loaded ones (cupy's cupyx and
    cupy.testing, once zarr has imported cupy): 1.3 s of a fresh ``tsconv process`` on the H200 machine, all
    inside the run's report. Naming ``module``'s file in inspect's map first makes the lookup a dict hit.
    """
    mod = sys.modules[module]
    files = getattr(inspect, "modulesbyfile", None)  # inspect's map of files to module names
    if isinstance(files, dict) and getattr(mod, "__file__", None):
        files.setdefault(inspect.getabsfile(mod), module)
    return torch.library.custom_op(name, mutates_args=())


def round_tf32_torch(w: torch.Tensor) -> torch.Tensor:
    """Round float32 to the nearest TF32 value, as ``round_tf32`` does in the kernels."""
    bits = w.contiguous().view(torch.int32)
    return ((bits + 0x1000) & -8192).view(torch.float32)


def recenter_sums(weight: torch.Tensor, tap_sums: torch.Tensor | None) -> torch.Tensor:
    """The tap sums the level is added back with: the caller's, else the stored weight's own."""
    return tap_sums if tap_sums is not None else _tap_sums(weight)


def _tap_sums(weight: torch.Tensor) -> torch.Tensor:
    """float64 [O, C/groups], contiguous: each filter's sum over taps, which ``recenter`` multiplies by the
    level it subtracted. float64, and the add-back summed in float64: a dense filter that is zero-sum over
    channels and taps together has per-channel tap sums that cancel only across channels, and float32 sums
    of level-sized terms would bring back the very error recentering removes (measured in the interpreter)."""
    return WEIGHTS.get(weight, ("tap_sums",), lambda w: w.double().sum(dim=2).contiguous())


# Output rows (conv1d) and rows (matmul) per CPU tile, each tile computed on one thread
# (tsconv.kernels.cpu_tiles). One thread's time per output row on the 2-core VM, by tile: a [6 -> 6, K 7]
# conv 134 / 48 / 33 / 45 ns at 128 / 512 / 1,024 / 65,536 rows, [1024 -> 32, K 5] 6.2 / 4.7 / 4.5 / 26 us,
# depthwise [64, K 9] 541 / 189 / 176 / 324 ns, [64 -> 64, K 16] 1,445 / 1,326 ns at 512 / 1,024: tiles of
# 512 rows keep the two cores of a 1,024-row chunk busy, tiles of 1,024 serve calls over 2,048 rows.
_CONV_TILE = 512
_MATMUL_TILE = 1024
_MIN_ROWS = 4


def conv1d_cpu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *, dilation: int = 1, groups: int = 1
) -> torch.Tensor:
    """``F.conv1d(x, weight, bias)`` ("valid") for a CPU ``x`` [N, C, L], in tiles of fixed shape, each on one
    thread: a call's bits depend on its shape only, not on the process's thread count. N = 1: tiles of
    ``_CONV_TILE`` output rows (twice that in calls of more than 4 tiles); N > 1 (re-centred blocks): as many
    rows of blocks a tile, at least two blocks each (torch computes a batch of one by another algorithm; a block's bits must not depend on how
    many blocks share its call). Under ``torch.compile`` a torch op (``torch.ops.tsconv.conv1d_cpu``), kept
    whole; called directly otherwise (an eager call through the op imported Triton into a CPU run)."""
    if torch.compiler.is_compiling():
        return _conv1d_cpu_op(x, weight, bias, dilation, groups)
    return _conv1d_tiles(x, weight, bias, dilation, groups)


@custom_op("tsconv::conv1d_cpu", __name__)
def _conv1d_cpu_op(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int, groups: int
) -> torch.Tensor:
    """``torch.ops.tsconv.conv1d_cpu``: :func:`conv1d_cpu`."""
    return _conv1d_tiles(x, weight, bias, dilation, groups)


def _conv1d_tiles(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int, groups: int
) -> torch.Tensor:
    n, _, length = x.shape
    n_out = length - dilation * (weight.shape[2] - 1)
    out = torch.empty((n, weight.shape[0], max(n_out, 0)), dtype=torch.result_type(x, weight))
    if n_out <= 0 or n == 0:
        return out
    if weight.shape[2] == 1:
        return _pointwise(x, weight, bias, groups)

    def conv(xs: torch.Tensor) -> torch.Tensor:
        return F.conv1d(xs, weight, bias, dilation=dilation, groups=groups)

    tile = _CONV_TILE if n * n_out <= 4 * _CONV_TILE else 2 * _CONV_TILE  # output rows a tile

    if n == 1:
        halo = length - n_out

        def rows(a: int, b: int) -> None:
            out[:, :, a:b] = conv(x[:, :, a : b + halo])

        tiles = [(a, min(a + tile, n_out)) for a in range(0, n_out, tile)]
    else:
        per = max(2, tile // n_out)

        def rows(a: int, b: int) -> None:
            if b - a == 1:
                out[a:b] = conv(x[a:b].expand(2, -1, -1))[:1]
            else:
                out[a:b] = conv(x[a:b])

        tiles = [(a, min(a + per, n)) for a in range(0, n, per)]
    run_tiles(rows, tiles)
    return out


def _pointwise(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, groups: int) -> torch.Tensor:
    """A one-tap conv of ``x`` [N, C, L] as :func:`rows_matmul` of its steps. torch computes it as a product
    whose rows are the output channels: with fewer than four of them (a [4 -> 2, K 1] stage, or one output a
    group) MKL's small-row kernels rounded each block by how many blocks shared the call, so a Stream's pushes
    differed from the batch run in the last bit. Each step is one row of the product here."""
    n, c, length = x.shape
    o = weight.shape[0]
    cg, og = c // groups, o // groups
    steps = x.reshape(n, groups, cg, length).permute(1, 0, 3, 2).reshape(groups, n * length, cg).contiguous()
    y = rows_matmul(steps, weight.reshape(groups, og, cg).transpose(1, 2).contiguous())  # [groups, N L, og]
    if bias is not None:
        y = y + bias.to(y.dtype).view(groups, 1, og)
    return y.reshape(groups, n, length, og).permute(1, 0, 3, 2).reshape(n, o, length)


@_conv1d_cpu_op.register_fake
def _conv1d_cpu_fake(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation: int, groups: int
) -> torch.Tensor:
    n_out = torch.sym_max(x.shape[2] - dilation * (weight.shape[2] - 1), 0)
    return x.new_empty((x.shape[0], weight.shape[0], n_out), dtype=torch.result_type(x, weight))


def rows_matmul(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``y @ w`` (y [..., n, K], w [..., K, N]) whose rows do not depend on how many rows share the call,
    where in it they sit, nor (on the CPU) on the process's thread count, so that a Stream's pushes, an
    update's calls and a dask worker's equal the batch run bit for bit.

    torch's CPU matmul (MKL) rounds a product of fewer than four rows, and a one-column product (a
    matrix-vector kernel), by other kernels whose bits depend on the row count and position; on several
    threads it splits a few rows' sums by the thread count. On one thread, with four rows or more and two
    columns or more, each float32 row's bits were the same at any count, offset and layout (18,240 cases, K 1
    to 4,096, N 1 to 1,000). So on the CPU: tiles of ``_MATMUL_TILE`` rows (at least four: a short call repeats
    its last row, a short last tile joins the one before), each on one thread, and a one-column ``w`` doubled.
    float64 rows are the same on any thread count, but not at any row count (MKL's dgemm: 766 of 2,592
    cases differed by an ulp): a caller rounding them to float32 sees that with odds of about 2^-29 a value."""
    if y.device.type != "cpu":
        return y @ w if y.shape[-2] != 1 else (torch.cat([y, y], dim=-2) @ w)[..., :1, :]
    return _rows_matmul_op(y, w) if torch.compiler.is_compiling() else _rows_tiles(y, w)


@custom_op("tsconv::rows_matmul", __name__)
def _rows_matmul_op(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch.ops.tsconv.rows_matmul``: :func:`rows_matmul` on the CPU, kept whole by ``torch.compile``."""
    return _rows_tiles(y, w)


def _rows_tiles(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    n, cols = y.shape[-2], w.shape[-1]
    out = torch.empty((*y.shape[:-2], n, cols), dtype=torch.result_type(y, w))
    if n == 0 or out.numel() == 0:
        return out
    wide = w if cols >= 2 else torch.cat([w, w], dim=-1)

    def rows(a: int, b: int) -> None:
        part = y[..., a:b, :]
        if b - a < _MIN_ROWS:
            part = torch.cat(
                [part, part[..., -1:, :].expand(*part.shape[:-2], _MIN_ROWS - (b - a), -1)], dim=-2
            )
        out[..., a:b, :] = (part @ wide)[..., : b - a, :cols]

    starts = list(range(0, n, _MATMUL_TILE))
    if len(starts) > 1 and n - starts[-1] < _MIN_ROWS:
        starts.pop()
    run_tiles(rows, list(zip(starts, [*starts[1:], n], strict=True)))
    return out


@_rows_matmul_op.register_fake
def _rows_matmul_fake(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return y.new_empty((*y.shape[:-2], y.shape[-2], w.shape[-1]), dtype=torch.result_type(y, w))


def _strided(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values in a view of stride 2 along its last dimension.

    torch's CPU gelu rounds differently in its vectorised loop (contiguous runs of a call) and its scalar loop
    (a call's last few elements, and strided inputs): up to half the values differed by an ulp between the two,
    so a value's bits depended on where it sat in the call, and a Stream's pushes of any length differed from
    the batch run's chunks (and grew to 1.9e-6 through a z-score after it). Every element through the scalar
    loop gives each value the same bits in any call; measured 6x slower than the vectorised loop (15 against
    2.5 ns a value on the 2-core VM), on dense stages only."""
    out = torch.empty((*x.shape, 2), dtype=x.dtype)[..., 0]
    return out.copy_(x)


def apply_activation(x: torch.Tensor, name: str | None) -> torch.Tensor:
    """Apply ``none``/``relu``/``gelu`` (exact erf form)/``tanh`` in place where possible."""
    if name is None or name == "none":
        return x
    if name == "relu":
        return torch.relu_(x)
    if name == "gelu":
        return F.gelu(x) if x.device.type != "cpu" else F.gelu(_strided(x))
    if name == "tanh":
        return torch.tanh_(x)
    msg = f"unknown activation {name!r}; expected one of none, relu, gelu, tanh"
    raise ValueError(msg)
