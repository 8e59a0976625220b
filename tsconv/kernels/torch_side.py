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
from tsconv.kernels.weight_cache import WeightCache

__all__ = [
    "INTERPRETED",
    "WEIGHTS",
    "apply_activation",
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


def rows_matmul(y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``y @ w`` whose rows do not depend on how many rows ``y`` has. torch's CPU matmul of a single row
    takes a matrix-vector kernel that rounds differently from the matrix product of two or more rows (each of
    which it computes alike), so a Stream's one-row push would not equal the batch run bit for bit."""
    if y.shape[0] != 1:
        return y @ w
    return (torch.cat([y, y]) @ w)[:1]


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
