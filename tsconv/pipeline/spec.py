"""Pipeline specification: TOML files, validation, and resolution against a store's features.

A :class:`Pipeline` is what a file says (stages, options, weights loaded from disk). :func:`resolve`
binds it to a number of input features and gives a :class:`ResolvedPipeline`: concrete weight arrays
in their stored precision, output names, and the halo (receptive field) the engine needs.
The schema is documented in ``pipelines/README.md``. The built-in pipelines are TOML files shipped in
``tsconv/pipeline/builtin/`` (their weights under its ``weights/``); :func:`load_pipeline` takes a built-in's
bare name (``"trend_ema"``) as well as a path.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import functools
import hashlib
import json
import os
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tsconv.errors import PipelineError, ShapeError, first_line
from tsconv.io.names import control_name, matching
from tsconv.io.npyheader import read_npy_header
from tsconv.pipeline.filters import Filter, bank_weights, filter_spec

__all__ = [
    "ACTIVATIONS",
    "PipelineLike",
    "WEIGHT_DTYPES",
    "StageSpec",
    "HeadSpec",
    "Pipeline",
    "Preprocess",
    "Layer",
    "ResolvedPipeline",
    "load_pipeline",
    "builtin_pipelines",
    "builtin_descriptions",
    "pipeline_from_dict",
    "as_pipeline",
    "default_pipeline",
    "resolve",
    "select_columns",
]

# The [preprocess] z-score's arithmetic, part of a pipeline's fingerprint where it has one (see fingerprint)
ZSCORE_ARITHMETIC = 3
# How log levels (transform = "log", no z-score) reach the first stage, part of such a pipeline's fingerprint:
# 2 = in float64 on the CPU, centred before rounding for a first Triton stage (1, unrecorded: rounded first)
LOG_ARITHMETIC = 2

ACTIVATIONS = ("none", "relu", "gelu", "tanh")
WEIGHT_DTYPES = ("float16", "float32")
MAX_DILATION = 1 << 20
# The halo is held in memory for every chunk (halo + chunk rows x features): past this it cannot be.
MAX_HALO = 1 << 24
FP16_MAX = 65504.0

_TOP_KEYS = {"name", "description", "weight_dtype", "preprocess", "conv", "head"}
_PRE_KEYS = {"select", "select_regex", "transform", "zscore", "fill", "time_range"}
TRANSFORMS = ("none", "log", "diff", "log_return")
FILLS = ("ffill", "none")
_CONV_KEYS = {
    "name",
    "weights",
    "weights_key",
    "bias",
    "bias_key",
    "filters",
    "dilation",
    "groups",
    "activation",
    "weight_dtype",
}
_HEAD_KEYS = {"name", "weights", "weights_key", "bias", "bias_key", "activation", "weight_dtype"}

# The built-in pipelines: every .toml file here, by its stem. Weight files lie under it, as the rule that
# weights stay inside the pipeline file's folder wants.
BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"

# The same text as builtin/default.toml (a test keeps them equal); used when no pipeline is given.
DEFAULT_PIPELINE_TOML = """\
# The default pipeline: level-free momentum and mean-reversion features for every input feature.
# Each filter is computed from its definition in float64 (raw price levels are safe) with its own warm-up.
name = "default"
description = "per-feature differences over 1, 32 and 256 steps and deviations from 32- and 256-step means"

[[conv]]
name = "bank"
filters = ["diff:1", "diff:32", "diff:256", "dev:32", "dev:256"]
"""


@dataclass(frozen=True)
class StageSpec:
    """One ``[[conv]]`` stage as written: either file weights or a built-in filter bank."""

    name: str
    weight: np.ndarray | None = field(repr=False)  # [O, C/groups, K] float64, from a file
    bias: np.ndarray | None = field(repr=False)  # [O]
    filters: tuple[str, ...] | None  # built-in bank, applied depthwise
    dilation: int
    groups: int | str  # an int, or "depthwise" (= number of input channels)
    activation: str
    weight_dtype: str
    source: dict[str, Any]


@dataclass(frozen=True)
class HeadSpec:
    """The optional ``[head]``: ``act(y @ W + b)`` per step, W of shape [O, D]."""

    name: str
    weight: np.ndarray = field(repr=False)  # [O, D] float64
    bias: np.ndarray | None = field(repr=False)  # [D]
    activation: str
    weight_dtype: str
    source: dict[str, Any]


@dataclass(frozen=True)
class Preprocess:
    """The optional ``[preprocess]`` table: fill, select, transform, z-score (applied in that order).

    The preprocessed series is defined on steps t >= 0 only; it is NaN where it would need earlier steps
    (``pre_halo`` leading steps). ``time_range`` selects output rows of a store by time (see ``process``).
    """

    select: tuple[str, ...] | None = None  # names or fnmatch patterns
    select_regex: str | None = None  # one regex, re.search
    transform: str = "none"
    zscore: int | None = None  # causal rolling window W >= 2
    fill: str = "ffill"
    time_range: tuple[str, str] | None = None  # ISO strings, UTC, [start, end)

    @property
    def differences(self) -> bool:
        return self.transform in ("diff", "log_return")

    @property
    def logs(self) -> bool:
        return self.transform in ("log", "log_return")

    @property
    def log_levels(self) -> bool:
        """Whether the first stage gets levels of the data: logs, with no difference or z-score after them."""
        return self.transform == "log" and self.zscore is None

    @property
    def pre_halo(self) -> int:
        """Leading steps the transform and z-score need: 1 for a difference, W - 1 for a z-score."""
        return int(self.differences) + (self.zscore - 1 if self.zscore else 0)

    @property
    def computes(self) -> bool:
        """Whether the backend has work to do (a transform or a z-score)."""
        return self.transform != "none" or self.zscore is not None

    def time_range_ns(self) -> tuple[int, int] | None:
        if self.time_range is None:
            return None
        a, b = (_parse_time(t) for t in self.time_range)
        return a, b

    def as_dict(self) -> dict[str, Any]:
        return {
            "select": None if self.select is None else list(self.select),
            "select_regex": self.select_regex,
            "transform": self.transform,
            "zscore": self.zscore,
            "fill": self.fill,
            "time_range": None if self.time_range is None else list(self.time_range),
        }


# a UTC offset ending a timestamp's time: +hh:mm, +hhmm or +hh (ISO 8601's extended and basic forms)
_OFFSET = re.compile(r"(?P<time>[T ].*?)(?P<sign>[+-])(?P<hh>\d{2})(?::?(?P<mm>\d{2}))?")
_DATE_TIME = re.compile(r"-?\d{4,}(-\d{2}(-\d{2}([T ]\d{2}(:\d{2}(:\d{2}(\.\d+)?)?)?)?)?)?")
_TIME_FORMS = '"2026-01-02", "2026-01-02T09:30:00[.fff]" (UTC), with an offset Z, +05:00, +0500 or +05'


def _parse_time(value: str) -> int:
    """An ISO timestamp as int64 ns since the epoch: naive ones are UTC, an offset (``Z``, ``+05:00``,
    ``+0500``, ``+05``) is converted. A ValueError saying which: a value that is not such a timestamp, or
    one outside what int64 nanoseconds hold (1677-09-21 to 2262-04-11)."""
    text = value.strip()
    if text.endswith(("Z", "z")):  # as ingest reads it (RFC 3339 allows either case)
        text = text[:-1]
    offset = _dt.timedelta(0)
    m = _OFFSET.fullmatch(text, 10)
    if m and int(m["hh"]) < 24 and int(m["mm"] or 0) < 60:  # an offset: numpy parses none
        offset = _dt.timedelta(hours=int(m["hh"]), minutes=int(m["mm"] or 0)) * (
            1 if m["sign"] == "+" else -1
        )
        text = text[:10] + m["time"]
    # Only a date and a time reach numpy: it warns and guesses at a zone it does not know ("+1"), and reads
    # "now" and "today" as the clock; a filter that turned its warning into an error was the process's
    # (warnings.catch_warnings), so two threads loading pipelines could leave every warning an error.
    us = np.datetime64("NaT")
    if _DATE_TIME.fullmatch(text):
        try:
            us = np.datetime64(text, "us")  # its range holds any date: ns would wrap past 2262 silently
        except (ValueError, OverflowError):
            pass
    if np.isnat(us):
        raise ValueError(f"{value!r} is not a recognised ISO timestamp ({_TIME_FORMS})")
    lim = np.iinfo(np.int64).max // 1000
    outside = ValueError(
        f"{value!r} is not an ISO timestamp between 1677-09-21 and 2262-04-11 (int64 nanoseconds)"
    )
    if not -lim <= int(us.astype(np.int64)) <= lim:
        raise outside
    # numpy wraps a local time past int64 ns (its last microsecond's digits, or the offset's shift to UTC), into
    # the other end of the range: checked in Python integers
    local = int(np.datetime64(text, "ns").astype(np.int64))
    ns = local - int(offset.total_seconds()) * 10**9
    if local // 1000 != int(us.astype(np.int64)) or not -lim * 1000 <= ns <= np.iinfo(np.int64).max:
        raise outside
    return ns


@dataclass(frozen=True)
class Pipeline:
    """A validated pipeline, not yet bound to a number of input features."""

    name: str
    stages: tuple[StageSpec, ...]
    head: HeadSpec | None
    origin: str  # the file it came from, or "default" / "<dict>"
    text: str | None = field(default=None, repr=False)  # the TOML text as read
    preprocess: Preprocess | None = None


@dataclass(frozen=True)
class Layer:
    """A conv stage bound to its input width: weights rounded to their stored dtype, kept as float32."""

    name: str
    weight: np.ndarray = field(repr=False)  # [O, C/groups, K] float32 (exactly the stored values)
    bias: np.ndarray | None = field(repr=False)  # [O] float32
    dilation: int
    groups: int
    activation: str
    weight_dtype: str
    given: np.ndarray = field(repr=False)  # [O, C/groups, K] float64: the weights as given, before rounding
    # [O, C/groups] float64: each filter's sum over taps of the weights as given (the level term of a
    # centred stage uses it, so FP16 rounding never adds level x (rounded sum - true sum) to its outputs)
    tap_sums: np.ndarray = field(repr=False)
    # A built-in bank: its filters, computed from their definitions (tsconv.kernels.filterbank) in float64;
    # weight and given then hold the filters' linear forms (filters.parse_filter), which no path runs.
    filters: tuple[Filter, ...] | None = None

    @property
    def structured(self) -> bool:
        return self.filters is not None

    @property
    def in_channels(self) -> int:
        return self.weight.shape[1] * self.groups

    @property
    def out_channels(self) -> int:
        return self.weight.shape[0]

    @property
    def taps(self) -> int:
        return self.weight.shape[2]

    @property
    def halo(self) -> int:
        return (self.taps - 1) * self.dilation


@dataclass(frozen=True)
class HeadLayer:
    name: str
    weight: np.ndarray = field(repr=False)  # [O, D] float32 (stored values)
    bias: np.ndarray | None = field(repr=False)  # [D] float32
    activation: str
    weight_dtype: str
    given: np.ndarray = field(repr=False)  # [O, D] float64: the weights as given, before rounding


@dataclass(frozen=True)
class ResolvedPipeline:
    """A pipeline bound to its input features: what the engine runs."""

    pipeline: Pipeline
    layers: tuple[Layer, ...]
    head: HeadLayer | None
    input_names: tuple[str, ...]  # the selected features, the first stage's inputs
    output_names: tuple[str, ...]
    columns: tuple[int, ...] | None = None  # the selected features' columns in the source; None: all
    source_width: int | None = None  # how many features the source had (the width ``columns`` index)
    # Per output: its warm-up, the first steps whose receptive field reaches before step 0 (NaN with
    # --warmup nan). Each filter of a bank has its own, so a diff:1 beside a dev:256 is valid from step 1.
    warmups: tuple[int, ...] = ()

    def warmup_groups(self) -> list[tuple[int, np.ndarray | slice]]:
        """``(rows, columns)`` for each distinct warm-up > 0: the output columns whose first ``rows`` steps
        are warm-up (``slice(None)`` when every output shares it)."""
        w = np.asarray(self.warmups if self.warmups else (self.halo,) * self.n_outputs, dtype=np.int64)
        values = sorted({int(v) for v in w if v > 0})
        if len(values) == 1 and (w == values[0]).all():
            return [(values[0], slice(None))]
        return [(v, np.flatnonzero(w == v)) for v in values]

    def nan_rows(self, warmup: str) -> tuple[int, ...]:
        """Per output, the leading steps a run with ``warmup`` leaves NaN: its warm-up with "nan"; with
        "zero" none, unless a ``[preprocess]`` leaves its first steps NaN, which reach every output as
        NaNs before a feature's first value do (zero history does not compute them)."""
        warm = self.warmups if self.warmups else (self.halo,) * self.n_outputs
        return tuple(warm) if warmup == "nan" or self.pre_halo else (0,) * len(warm)

    @property
    def preprocess(self) -> Preprocess | None:
        return self.pipeline.preprocess

    @property
    def pre_halo(self) -> int:
        return 0 if self.pipeline.preprocess is None else self.pipeline.preprocess.pre_halo

    @property
    def halo(self) -> int:
        """Receptive field minus one: the preprocessing's leading steps plus (K_i - 1) * dilation_i per stage."""
        return self.pre_halo + sum(layer.halo for layer in self.layers)

    @property
    def n_outputs(self) -> int:
        return len(self.output_names)

    @functools.cached_property
    def _digests(self) -> dict[int, str | None]:
        """SHA-256 of each weight and bias array by id, taken once: a run describes itself several times
        (fingerprint, metadata, report), a few milliseconds each for a wide stage."""
        arrays = [a for L in self.layers for a in (L.weight, L.bias)]
        if self.head is not None:
            arrays += [self.head.weight, self.head.bias]
        return {
            id(a): None if a is None else hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
            for a in arrays
        }

    @property
    def first_on_levels(self) -> bool:
        """Whether the first stage is a conv (not a bank, which computes in float64 from the raw values) on
        level data: raw values, or their logs without a z-score. Such a stage is re-centred per block, and its
        level term uses the tap sums of its weights as given (tsconv.engine.compute); returns, differences
        and z-scores are not levels."""
        pre = self.preprocess if self.preprocess is not None and self.preprocess.computes else None
        return (pre is None or pre.log_levels) and not self.layers[0].structured

    def _given_sums(self, index: int, layer: Layer, *, with_sums: bool) -> dict[str, str]:
        """The digest of the first stage's tap sums of the weights as given, where it reads levels and rounding
        to the stored dtype changed them: its level term uses them, so two weight files that round alike but
        sum apart compute apart (an update mixed their outputs). Absent elsewhere (the stored weights say it
        all) and without ``with_sums`` (the fingerprint outputs written before it had)."""
        if not with_sums or index or not self.first_on_levels:
            return {}
        if np.array_equal(layer.tap_sums, tap_sums(layer.weight)):
            return {}
        return {"tap_sums_sha256": hashlib.sha256(np.ascontiguousarray(layer.tap_sums).tobytes()).hexdigest()}

    def as_run(self, *, with_sums: bool = True) -> dict[str, Any]:
        """A JSON-able description of what ran, with content hashes of every weight array (``with_sums``: and
        of the first stage's tap sums where they matter, :meth:`_given_sums`)."""

        def digest(a: np.ndarray | None) -> str | None:
            return None if a is None else self._digests[id(a)]

        origin = self.pipeline.origin
        return {
            "name": self.pipeline.name,
            # a file's path as the run's folder names it: `tsconv inspect`'s resume command names this file,
            # run from any folder (a relative path named no file there, or another one)
            "origin": origin if origin in ("default", "<dict>") else os.path.abspath(origin),
            "halo": self.halo,
            "preprocess": None if self.preprocess is None else self.preprocess.as_dict(),
            "stages": [
                {
                    **stage.source,
                    "name": layer.name,
                    "shape": list(layer.weight.shape),
                    "dilation": layer.dilation,
                    "groups": layer.groups,
                    "activation": layer.activation,
                    "weight_dtype": layer.weight_dtype,
                    "weight_sha256": digest(layer.weight),
                    "bias_sha256": digest(layer.bias),
                    **self._given_sums(i, layer, with_sums=with_sums),
                    # how a bank is computed: "filters-3" each filter from its definition with its own
                    # warm-up, means divided by their window exactly (filters-2 multiplied by 1 / W, which
                    # CUDA kernels rounded to float32; filters-1: a dense convolution padded to the longest
                    # filter); outputs of another version are not extended or resumed
                    **({"compute": "filters-3"} if layer.structured else {}),
                    **_moments_arithmetic(f.taps for f in layer.filters or () if f.kind in ("std", "zscore")),
                    # an EMA of alpha 1 over several taps gave the current value whatever its window held; it
                    # is NaN / +-inf where the window holds one now: such an output is not continued
                    **(
                        {"ema_alpha_1": "window-nan"}
                        if any(f.kind == "ema" and f.alpha == 1 and f.taps > 1 for f in layer.filters or ())
                        else {}
                    ),
                }
                for i, (stage, layer) in enumerate(zip(self.pipeline.stages, self.layers, strict=True))
            ],
            "head": None
            if self.head is None
            else {
                **self.pipeline.head.source,
                "name": self.head.name,
                "shape": list(self.head.weight.shape),
                "activation": self.head.activation,
                "weight_dtype": self.head.weight_dtype,
                "weight_sha256": digest(self.head.weight),
                "bias_sha256": digest(self.head.bias),
            },
            "text": self.pipeline.text,
        }

    def fingerprint(self, *, with_sums: bool = True) -> str:
        """A hash that changes whenever the computation would change (``with_sums=False``: as outputs written
        before the first stage's tap sums entered it had it)."""
        run = self.as_run(with_sums=with_sums)
        run.pop("origin")
        run.pop("text")
        parts: list[Any] = [run, list(self.input_names), self.columns]
        if self.preprocess is not None and self.preprocess.zscore is not None:
            # the z-score's arithmetic changed (pairwise moments; float32 rows not centred): an output of the
            # old is not continued by the new, whose rows would differ in the last bits
            parts.append(
                {"zscore_arithmetic": ZSCORE_ARITHMETIC, **_moments_arithmetic([self.preprocess.zscore])}
            )
        if self.preprocess is not None and self.preprocess.log_levels:
            # rows of log levels rounded before the stages differ from these by up to 2.5e-3 of a difference's
            # scale: an output of the old is not continued (mixed rows) but refused
            parts.append({"log_arithmetic": LOG_ARITHMETIC})
        blob = json.dumps(parts, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


def _moments_arithmetic(windows: Iterable[int]) -> dict[str, str]:
    """The fingerprint's word on how the standard deviations of ``windows`` are joined, where it changed:
    a window of three binary digits or more (7, 31, 100) carries the mean of its joined segments (its sum over
    their count rounded, and gave a flat float64 window a std of 1e-14, not 0); the other windows' bits did
    not change, and their outputs are continued as before."""
    return {"moments": "carried-mean"} if any(w.bit_count() >= 3 for w in windows) else {}


# --------------------------------------------------------------------------------------------- loading


def load_pipeline(path: str | os.PathLike[str] | dict[str, Any]) -> Pipeline:
    """Read and validate a pipeline TOML file (weight paths are relative to the file, and the weight files
    must lie inside its folder), or a pipeline given as a dict with the TOML file's structure
    (:func:`pipeline_from_dict`)."""
    if isinstance(path, dict):
        return pipeline_from_dict(path)
    if not isinstance(path, str | os.PathLike):
        raise PipelineError(
            f"a pipeline is a path to a TOML file or a dict, got {type(path).__name__}",
            hint="pass pipeline='trend_ema' (a built-in), a path like 'my_pipeline.toml', or a dict like "
            "{'conv': [{'filters': ['ma:16']}]}.",
        )
    if not os.fspath(path).strip():
        raise PipelineError(
            "the pipeline is an empty string",
            hint=f"pass the path of a .toml file, or a built-in pipeline's name: {', '.join(builtin_pipelines())}.",
        )
    p = _builtin_or_path(path)
    if not p.is_file():
        raise PipelineError(
            f"pipeline file {str(p)!r} " + ("is not a regular file" if p.exists() else "does not exist"),
            hint=f"pass the path of a .toml file, or a built-in pipeline's name: {', '.join(builtin_pipelines())}.",
        )
    text, data = _read_toml(p)
    # weight paths are relative to the file itself, not to a symbolic link naming it
    return pipeline_from_dict(data, base_dir=p.resolve().parent, origin=str(p), text=text, confine=True)


def _read_toml(p: Path) -> tuple[str, dict[str, Any]]:
    """A pipeline file's text and its TOML, or a PipelineError saying why not (OSError as it comes)."""
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark, as some editors write, is not TOML
    except UnicodeDecodeError as exc:
        raise PipelineError(
            f"{p}: not a UTF-8 text file ({exc.reason} at byte {exc.start})",
            hint="check that the path names the pipeline's .toml file, and save it as UTF-8 text.",
        ) from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PipelineError(
            f"{p}: not valid TOML: {exc}",
            hint="fix the file at that line; pipelines/README.md shows a pipeline file's tables.",
        ) from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise PipelineError(f"{p}: its arrays or tables nest too deeply for a pipeline file") from None


def pipeline_files(pipeline: Any) -> tuple[Path, ...]:
    """The files a pipeline given by path or built-in name is read from: its TOML file and the weight and bias
    files its tables name, resolved as :func:`load_pipeline` resolves them (so that a command can refuse to
    write over them before it runs); () for a dict, or a file that cannot be read (the run reports it)."""
    if not isinstance(pipeline, str | os.PathLike) or not os.fspath(pipeline).strip():
        return ()
    try:
        p = _builtin_or_path(pipeline)
        _, data = _read_toml(p)
    except (OSError, PipelineError):
        return ()
    conv = data.get("conv")
    tables = [*(conv if isinstance(conv, list) else []), data.get("head")]
    named = [
        t[k] for t in tables if isinstance(t, dict) for k in ("weights", "bias") if isinstance(t.get(k), str)
    ]
    base = p.resolve().parent
    return (p, *(Path(v) if Path(v).is_absolute() else base / v for v in named if v and "\0" not in v))


def builtin_pipelines() -> dict[str, Path]:
    """The built-in pipelines' files, by name (the file's stem), in name order."""
    return {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.toml"))}


def builtin_descriptions() -> dict[str, str]:
    """Each built-in pipeline's ``description`` (its name when it has none), by name."""
    out = {}
    for name, path in builtin_pipelines().items():
        text = tomllib.loads(path.read_text(encoding="utf-8"))
        out[name] = str(text.get("description", text.get("name", name)))
    return out


def _builtin_or_path(path: str | os.PathLike[str]) -> Path:
    """A bare name (no path separator, no ``.toml`` suffix) names a built-in pipeline when one has that name;
    a bare name that is neither a built-in nor an existing file is refused, listing the built-ins. Anything
    else is a path."""
    text = os.fspath(path)
    seps = {os.sep, os.altsep, "/"} - {None}
    if isinstance(text, str) and text and not any(c in text for c in seps) and not text.endswith(".toml"):
        found = builtin_pipelines()
        if text in found:
            return found[text]
        if not Path(text).is_file():
            close = difflib.get_close_matches(text, list(found), n=1)
            raise PipelineError(
                f"{text!r} is neither a pipeline file nor a built-in pipeline (built-in: {', '.join(found)})",
                hint=(f"did you mean {close[0]!r}? " if close else "")
                + "pass a built-in's name, or the path of a .toml file (`tsconv pipelines` lists the built-ins).",
            )
    return Path(path)


def default_pipeline() -> Pipeline:
    """The pipeline used when none is given (see ``DEFAULT_PIPELINE_TOML``)."""
    return pipeline_from_dict(
        tomllib.loads(DEFAULT_PIPELINE_TOML), base_dir=Path("."), origin="default", text=DEFAULT_PIPELINE_TOML
    )


# What the library's entries take as a pipeline (see as_pipeline).
PipelineLike = str | os.PathLike[str] | Pipeline | dict[str, Any] | None


def as_pipeline(pipeline: PipelineLike) -> Pipeline:
    """A :class:`Pipeline` from what the library's entries take: None (the default pipeline), a Pipeline, a
    dict with the TOML file's structure, a built-in's name or a path to a TOML file."""
    if pipeline is None:
        return default_pipeline()
    if isinstance(pipeline, Pipeline):
        return pipeline
    if isinstance(pipeline, dict):
        return pipeline_from_dict(pipeline)
    if isinstance(pipeline, str | os.PathLike):
        return load_pipeline(pipeline)
    cls = type(pipeline)
    got = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    # a torch module (tsconv.nn.Pipeline) or a resolved pipeline is bound to its input features; the
    # pipeline it was made from is one attribute away
    plan = getattr(pipeline, "plan", None)
    if isinstance(pipeline, ResolvedPipeline) or isinstance(plan, ResolvedPipeline):
        attr = ".pipeline" if isinstance(pipeline, ResolvedPipeline) else ".plan.pipeline"
        hint = (
            f"pass its {attr}: the tsconv.Pipeline it was made from, which features() binds to x's columns."
        )
    else:
        hint = (
            "pass pipeline='trend_ema' (a built-in), a path like 'my_pipeline.toml', a dict like "
            "{'conv': [{'filters': ['ma:16']}]}, or None."
        )
    raise PipelineError(
        "pipeline must be a path to a TOML file, a dict or a tsconv.Pipeline (tsconv.pipeline.spec.Pipeline), "
        f"got {got}",
        hint=hint,
    )


def pipeline_from_dict(
    data: dict[str, Any],
    *,
    base_dir: str | Path = ".",
    origin: str = "<dict>",
    text: str | None = None,
    confine: bool = False,
) -> Pipeline:
    """Validate a pipeline given as a dict with the TOML file's structure.

    Relative weight paths are taken from ``base_dir``. With ``confine`` (pipeline files), every weight file
    must lie inside ``base_dir`` once resolved, symlinks followed: a pipeline file from elsewhere cannot
    make tsconv read files outside its own folder. A dict from library code may name any file."""
    where = origin
    if not isinstance(data, dict):
        raise PipelineError(f"{where}: a pipeline must be a table, got {type(data).__name__}")
    _check_keys(data, _TOP_KEYS, where, "top level")
    base = _Base(Path(base_dir), confine)
    default_dtype = _choice(data, "weight_dtype", WEIGHT_DTYPES, "float16", where, "top level")
    convs = data.get("conv")
    if convs is None:
        raise PipelineError(
            f"{where}: no [[conv]] stage", hint="add at least one [[conv]] table with 'weights' or 'filters'."
        )
    if not isinstance(convs, list) or not convs or not all(isinstance(c, dict) for c in convs):
        raise PipelineError(f"{where}: 'conv' must be an array of tables written [[conv]]")
    stages = tuple(_stage_from_dict(c, i, base, where, default_dtype) for i, c in enumerate(convs, start=1))
    preprocess = None
    if "preprocess" in data:
        if not isinstance(data["preprocess"], dict):
            raise PipelineError(f"{where}: 'preprocess' must be a table written [preprocess]")
        preprocess = _preprocess_from_dict(data["preprocess"], where)
    head = None
    if "head" in data:
        if not isinstance(data["head"], dict):
            raise PipelineError(f"{where}: 'head' must be a table written [head]")
        last = stages[-1].weight
        inputs = int(last.shape[0]) if last is not None else None  # a filter bank's width needs the input
        head = _head_from_dict(data["head"], base, where, default_dtype, inputs)
    name = data.get("name", Path(origin).stem if origin not in ("<dict>", "default") else origin)
    if not isinstance(name, str):
        raise PipelineError(f"{where}: top level: 'name' must be a string, got {name!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise PipelineError(
            f"{where}: top level: 'description' must be a string, got {data['description']!r}"
        )
    # both reach reports, output metadata and `tsconv pipelines` on a terminal (an escape forged a report's
    # lines); a description may run over lines
    if control_name([name, description.replace("\n", " ").replace("\t", " ")]) is not None:
        what = "name" if control_name([name]) is not None else "description"
        raise PipelineError(
            f"{where}: top level: '{what}' holds a control character", hint="write it with printable text."
        )
    return Pipeline(name=name, stages=stages, head=head, origin=origin, text=text, preprocess=preprocess)


def _preprocess_from_dict(d: dict[str, Any], where: str) -> Preprocess:
    table = "[preprocess]"
    _check_keys(d, _PRE_KEYS, where, table)
    if "select" in d and "select_regex" in d:
        raise PipelineError(
            f"{where}: {table}: give at most one of 'select' (names or glob patterns) and 'select_regex'",
            hint="keep one: select = ['px_*'] (globs), or select_regex = '^px_' (one regex).",
        )
    select = None
    if "select" in d:
        raw = d["select"]
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list) or not raw or not all(isinstance(v, str) and v for v in raw):
            raise PipelineError(
                f"{where}: {table}: select must be a non-empty list of feature names or glob patterns, got {raw!r}",
                hint='e.g. select = ["px_*", "vol_0"].',
            )
        select = tuple(raw)
    regex = d.get("select_regex")
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise PipelineError(f"{where}: {table}: select_regex must be a non-empty string, got {regex!r}")
        try:
            re.compile(regex)
        except re.error as exc:
            raise PipelineError(
                f"{where}: {table}: select_regex {regex!r} is not a valid regex: {exc}"
            ) from None
    transform = _choice(d, "transform", TRANSFORMS, "none", where, table)
    fill = _choice(d, "fill", FILLS, "ffill", where, table)
    zscore = d.get("zscore")
    if zscore is not None and (
        isinstance(zscore, bool) or not isinstance(zscore, int) or not 2 <= zscore <= MAX_HALO
    ):
        raise PipelineError(
            f"{where}: {table}: zscore must be an integer window from 2 to {MAX_HALO:,}, got {zscore!r}",
            hint="zscore = W normalises each step by the mean and std of the last W steps.",
        )
    time_range = None
    if "time_range" in d:
        time_range = _time_range(d["time_range"], where, table)
    return Preprocess(
        select=select,
        select_regex=regex,
        transform=transform,
        zscore=zscore,
        fill=fill,
        time_range=time_range,
    )


def _time_range(raw: Any, where: str, table: str) -> tuple[str, str]:
    if not isinstance(raw, list) or len(raw) != 2:
        raise PipelineError(
            f"{where}: {table}: time_range must be [start, end], got {raw!r}",
            hint='e.g. time_range = ["2026-01-02T09:30:00", "2026-01-02T16:00:00"] (UTC, end exclusive).',
        )
    texts = []
    for v in raw:
        if isinstance(v, _dt.datetime):
            if v.tzinfo is not None:
                v = v.astimezone(_dt.UTC).replace(tzinfo=None)
            v = v.isoformat()
        elif isinstance(v, _dt.date):
            v = v.isoformat()
        if not isinstance(v, str):
            raise PipelineError(f"{where}: {table}: time_range values must be ISO timestamps, got {v!r}")
        try:
            _parse_time(v)
        except ValueError as exc:
            raise PipelineError(
                f"{where}: {table}: time_range value {exc}",
                hint='write e.g. "2026-01-02T09:30:00" (UTC) or "2026-01-02T14:30:00+05:00".',
            ) from None
        texts.append(v)
    if _parse_time(texts[0]) >= _parse_time(texts[1]):
        raise PipelineError(
            f"{where}: {table}: time_range start {texts[0]!r} is not before its end {texts[1]!r}"
        )
    return texts[0], texts[1]


def select_columns(pre: Preprocess | None, names: tuple[str, ...], where: str) -> tuple[int, ...] | None:
    """The columns ``[preprocess]`` selects from ``names`` (in their order); None when all of them."""
    if pre is None or (pre.select is None and pre.select_regex is None):
        return None
    if pre.select is not None:
        cols = matching(names, pre.select)
        asked = ", ".join(repr(p) for p in pre.select)
    else:
        rx = re.compile(pre.select_regex)
        cols = [j for j, n in enumerate(names) if rx.search(n)]
        asked = f"regex {pre.select_regex!r}"
    if not cols:
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        raise PipelineError(
            f"{where}: [preprocess]: select {asked} matches none of the features",
            hint=f"the features are {shown}.",
        )
    if pre.select is not None:
        # an entry without a glob's characters is a name: one the input lacks (a typo, a symbol not in this
        # store) was dropped while the others ran; an unmatched glob may be meant for other stores
        known = set(names)
        absent = [p for p in pre.select if p not in known and not any(c in p for c in "*?[")]
        if absent:
            close = difflib.get_close_matches(absent[0], names, n=1)
            raise PipelineError(
                f"{where}: [preprocess]: select names {', '.join(repr(p) for p in absent[:8])}, which "
                f"{'is not a feature' if len(absent) == 1 else 'are not features'} of the input",
                hint=(f"did you mean {close[0]!r}? " if close else "")
                + "remove the name, or write a glob pattern (e.g. 'px_*') for features some stores lack.",
            )
    return None if len(cols) == len(names) else tuple(cols)


def _check_key_pairs(d: dict[str, Any], where: str, table: str) -> None:
    """``weights_key``/``bias_key`` name a tensor in a .safetensors file given by ``weights``/``bias``."""
    for key in ("weights", "bias"):
        value = d.get(key)
        path = os.fspath(value) if isinstance(value, os.PathLike) else value
        if f"{key}_key" in d and not (isinstance(path, str) and path.lower().endswith(".safetensors")):
            raise PipelineError(
                f"{where}: {table}: {key}_key applies only when {key} is a .safetensors file",
                hint=f"remove {key}_key or point {key} at a .safetensors file.",
            )


def _check_keys(d: dict[str, Any], allowed: set[str], where: str, table: str) -> None:
    for key in d:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1) if isinstance(key, str) else []
            hint = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(sorted(allowed))}."
            raise PipelineError(f"{where}: {table}: unknown key {key!r}", hint=hint)


def _choice(
    d: dict[str, Any], key: str, options: tuple[str, ...], default: str, where: str, table: str
) -> str:
    value = d.get(key, default)
    if value not in options:
        raise PipelineError(
            f"{where}: {table}: {key} = {value!r} is not allowed", hint=f"use one of {', '.join(options)}."
        )
    return value


def _positive_int(d: dict[str, Any], key: str, default: int, where: str, table: str, *, most: int) -> int:
    value = d.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise PipelineError(
            f"{where}: {table}: {key} must be an integer from 1 to {most:,}, got {value!r}",
            hint=f"write a whole number, e.g. {key} = 2, or leave it out for {default}.",
        )
    return value


def _check_name(name: Any, where: str, table: str) -> None:
    if not isinstance(name, str) or not name:
        raise PipelineError(f"{where}: {table}: name must be a non-empty string, got {name!r}")
    if control_name([name]) is not None:  # it names every output of the stage, in stores and on terminals
        raise PipelineError(
            f"{where}: {table}: name {name!r} holds a control character", hint="name it with printable text."
        )


def _stage_from_dict(d: dict[str, Any], index: int, base: _Base, where: str, default_dtype: str) -> StageSpec:
    table = f"[[conv]] #{index}"
    _check_keys(d, _CONV_KEYS, where, table)
    _check_key_pairs(d, where, table)
    has_w, has_f = "weights" in d, "filters" in d
    if has_w == has_f:
        raise PipelineError(
            f"{where}: {table}: give exactly one of 'weights' (a .npy/.safetensors file) or 'filters' (a bank)",
            hint='e.g. filters = ["ma:16", "diff:1"] or weights = "w.npy".',
        )
    name = d.get("name", f"conv{index}")
    _check_name(name, where, table)
    dilation = _positive_int(d, "dilation", 1, where, table, most=MAX_DILATION)
    activation = _choice(d, "activation", ACTIVATIONS, "none", where, table)
    weight_dtype = _choice(d, "weight_dtype", WEIGHT_DTYPES, default_dtype, where, table)
    groups: int | str
    weight = bias = None
    filters = None
    source: dict[str, Any] = {}
    if has_f:
        raw = d["filters"]
        if not isinstance(raw, list) or not raw or not all(isinstance(f, str) for f in raw):
            raise PipelineError(
                f"{where}: {table}: filters must be a non-empty list of strings, got {raw!r}",
                hint='e.g. filters = ["ma:16", "diff:1"]; `tsconv filters` lists them.',
            )
        for f in raw:
            try:
                filter_spec(f)
            except PipelineError as exc:
                raise PipelineError(f"{where}: {table}: {exc.message}", hint=exc.hint) from None
        # one filter however it is written: ' ma:4' and 'ma:4', 'ma:04', 'ema:8' and 'ema:8:67' (its own window)
        keys = [(p.kind, p.n, p.taps) for p in map(filter_spec, raw)]
        dupes = sorted({f.strip() for f, k in zip(raw, keys, strict=True) if keys.count(k) > 1})
        if dupes:
            raise PipelineError(f"{where}: {table}: filters listed more than once: {', '.join(dupes)}")
        # a weight_dtype is accepted and changes nothing (a bank stores no weights): pipelines written when it
        # did are still read
        for key in ("bias", "bias_key", "weights_key"):
            if key in d:
                raise PipelineError(f"{where}: {table}: {key!r} does not apply to a filter bank")
        if "groups" in d and d["groups"] != "depthwise":
            raise PipelineError(
                f"{where}: {table}: a filter bank is depthwise; groups = {d['groups']!r} does not apply",
                hint="remove 'groups' from this stage.",
            )
        filters = tuple(raw)
        groups = "depthwise"
        source = {"filters": list(filters)}
    else:
        weight = _load_array(d, "weights", base, where, table, ndim=3)
        if "bias" in d:
            why = f"bias has {{got}} values but weights have {weight.shape[0]} output channels"
            bias = _load_array(d, "bias", base, where, table, ndim=1, expect={0: (weight.shape[0], why)})
            if bias.shape[0] != weight.shape[0]:
                raise PipelineError(
                    f"{where}: {table}: bias has {bias.shape[0]} values but weights have "
                    f"{weight.shape[0]} output channels",
                    hint="bias must have shape [O] for weights of shape [O, C/groups, K].",
                )
        g = d.get("groups", 1)
        if g == "depthwise":
            groups = "depthwise"
        elif isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise PipelineError(f'{where}: {table}: groups must be an integer >= 1 or "depthwise", got {g!r}')
        else:
            groups = g
            if weight.shape[0] % g:
                raise PipelineError(
                    f"{where}: {table}: groups = {g} does not divide the {weight.shape[0]} output channels",
                    hint="the number of output channels O must be a multiple of groups.",
                )
        source = _source(d)
    return StageSpec(
        name=name,
        weight=weight,
        bias=bias,
        filters=filters,
        dilation=dilation,
        groups=groups,
        activation=activation,
        weight_dtype=weight_dtype,
        source=source,
    )


def _head_from_dict(
    d: dict[str, Any], base: _Base, where: str, default_dtype: str, inputs: int | None = None
) -> HeadSpec:
    table = "[head]"
    _check_keys(d, _HEAD_KEYS, where, table)
    _check_key_pairs(d, where, table)
    if "weights" not in d:
        raise PipelineError(
            f"{where}: {table}: 'weights' is required", hint='weights = "head.npy" of shape [O, D].'
        )
    expect = {}
    if inputs is not None:
        expect[0] = (
            inputs,
            f"weights of shape {{shape}} expect {{got}} inputs, but the last stage gives {inputs}",
        )
    weight = _load_array(d, "weights", base, where, table, ndim=2, expect=expect)
    bias = None
    if "bias" in d:
        why = f"bias has {{got}} values but weights have {weight.shape[1]} outputs"
        bias = _load_array(d, "bias", base, where, table, ndim=1, expect={0: (weight.shape[1], why)})
        if bias.shape[0] != weight.shape[1]:
            raise PipelineError(
                f"{where}: {table}: bias has {bias.shape[0]} values but weights have {weight.shape[1]} outputs",
                hint="head bias must have shape [D] for weights of shape [O, D].",
            )
    name = d.get("name", "head")
    _check_name(name, where, table)
    return HeadSpec(
        name=name,
        weight=weight,
        bias=bias,
        activation=_choice(d, "activation", ACTIVATIONS, "none", where, table),
        weight_dtype=_choice(d, "weight_dtype", WEIGHT_DTYPES, default_dtype, where, table),
        source=_source(d),
    )


def _source(d: dict[str, Any]) -> dict[str, Any]:
    """Where the weights came from, for the record of the pipeline as run."""
    return {k: (d[k] if isinstance(d[k], str) else "<array>") for k in ("weights", "bias") if k in d}


def _load_array(
    d: dict[str, Any],
    key: str,
    base: _Base,
    where: str,
    table: str,
    *,
    ndim: int,
    expect: dict[int, tuple[int, str]] | None = None,
) -> np.ndarray:
    """Load a weight array from .npy (never unpickling) or .safetensors, as float64.

    Library callers may pass the array itself (numpy, torch or nested lists) instead of a path. ``expect``
    (axis -> (size, why)) is checked against a .npy file's header before its data are read.
    """
    expect = expect or {}
    rel = d[key]
    if isinstance(rel, os.PathLike):
        rel = os.fspath(rel)
    if not isinstance(rel, str):
        if isinstance(rel, np.ma.MaskedArray) and np.ma.is_masked(rel):
            raise PipelineError(
                f"{where}: {table}: {key} is a masked array with masked entries; tsconv would read the values "
                "under the mask as weights",
                hint=f"give plain values, e.g. {key}=arr.filled(0.0) if masked weights mean 0.",
            )
        try:
            arr = np.asarray(_tensor_values(rel) if hasattr(rel, "detach") else rel)
        except Exception:
            arr = None
        if arr is None or arr.dtype == object or arr.ndim == 0:
            raise PipelineError(
                f"{where}: {table}: {key} must be a file path or a numeric array, got {rel!r}"[:300],
                hint=f'write {key} = "w.npy" (a path relative to the pipeline file).',
            )
        return _check_array(arr, key, "<array>", where, table, ndim)
    if not rel:
        raise PipelineError(f"{where}: {table}: {key} must be a file path, got an empty string")
    if "\0" in rel:
        raise PipelineError(
            f"{where}: {table}: {key} file {rel!r} holds a NUL character", hint="name a file."
        )
    path = Path(rel) if Path(rel).is_absolute() else base.dir / rel
    if base.confine:
        _check_inside(path, rel, base.dir, key, where, table)
    if not path.is_file():
        raise PipelineError(
            f"{where}: {table}: {key} file {str(path)!r} "
            + ("is not a regular file" if path.exists() else "does not exist"),
            hint="paths are relative to the pipeline file.",
        )
    tensor_key = d.get(f"{key}_key")
    if tensor_key is not None and not isinstance(tensor_key, str):
        raise PipelineError(
            f"{where}: {table}: {key}_key must be a string (a tensor's name in the .safetensors file), got "
            f"{tensor_key!r}"[:300]
        )
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            _check_npy_header(path, key, where, table, ndim, expect)
            arr = np.load(path, allow_pickle=False)
        elif suffix == ".safetensors":
            arr = _load_safetensors(path, tensor_key, where, table, key)
        else:
            raise PipelineError(
                f"{where}: {table}: {key} file {str(path)!r} has an unknown type {suffix!r}",
                hint="use a .npy or .safetensors file.",
            )
    except PipelineError:
        raise
    except MemoryError:
        raise _too_big(path, key, where, table) from None
    except Exception as exc:  # a corrupt or hostile file: say which and why, no traceback
        raise PipelineError(
            f"{where}: {table}: cannot read {key} file {str(path)!r}: {first_line(exc)}",
            hint=f"check that it is a {suffix} file of numbers, or save the weights again as float32.",
        ) from None
    try:
        return _check_array(arr, key, repr(str(path)), where, table, ndim)
    except MemoryError:  # the float64 copy
        raise _too_big(path, key, where, table) from None


def _tensor_values(t: Any) -> np.ndarray:
    """A torch tensor's values as a numpy array; bfloat16 and float8 (torch's training dtypes, which numpy
    lacks) as float32, which holds each of their values exactly (as from a .safetensors file)."""
    t = t.detach().cpu()
    if t.is_floating_point() and t.element_size() < 4 and str(t.dtype) != "torch.float16":
        t = t.float()
    return t.numpy()


def _too_big(path: Path, key: str, where: str, table: str) -> PipelineError:
    size = path.stat().st_size
    return PipelineError(
        f"{where}: {table}: not enough memory to load {key} file {str(path)!r} ({size / 2**20:,.1f} MiB, "
        "held as float64 once loaded)",
        hint="check that this is the intended weights file; a pipeline's weights are usually a few MiB.",
    )


def _check_npy_header(
    path: Path, key: str, where: str, table: str, ndim: int, expect: dict[int, tuple[int, str]]
) -> None:
    """Check a .npy file's header (shape, dtype, data size) before anything is allocated for it: a
    header that claims gigabytes, or a shape the pipeline cannot use, is refused without reading the data.

    ``expect`` maps an axis to the size the pipeline needs there and the message when it differs
    (``{got}``: the size in the file, ``{shape}``: its shape)."""
    with open(path, "rb") as f:
        try:
            shape, dtype = read_npy_header(f)
        except Exception as exc:
            raise PipelineError(
                f"{where}: {table}: cannot read {key} file {str(path)!r}: not a valid .npy header ({exc})"
            ) from None
        offset = f.tell()
    label = repr(str(path))
    if dtype.hasobject:
        raise PipelineError(
            f"{where}: {table}: cannot read {key} file {label}: it holds Python objects (dtype {dtype}); "
            "tsconv never unpickles",
            hint="save the weights as a numeric array: np.save(path, np.asarray(w, dtype=np.float32)).",
        )
    if dtype.kind not in "fiu":
        raise PipelineError(f"{where}: {table}: {key} in {label} has non-numeric dtype {dtype}")
    if len(shape) != ndim:
        want = {3: "[O, C/groups, K]", 2: "[O, D]", 1: "[n]"}[ndim]
        raise PipelineError(
            f"{where}: {table}: {key} in {label} has shape {list(shape)}, expected {ndim}-D {want}"
        )
    for axis, (size, why) in expect.items():
        if shape[axis] != size:
            msg = why.format(got=shape[axis], shape=list(shape))
            raise PipelineError(f"{where}: {table}: {msg} (the header of {label}; its data were not read)")
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize  # Python ints: a hostile shape cannot overflow
    held = path.stat().st_size - offset
    if held < need:
        raise PipelineError(
            f"{where}: {table}: cannot read {key} file {label}: its header declares shape {list(shape)} "
            f"{dtype} ({_bytes(need)} of data) but it holds {_bytes(held)} after the header",
            hint="the file is truncated or its header is damaged: save the weights again.",
        )


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,} bytes"


@dataclass(frozen=True)
class _Base:
    """Where relative weight paths start, and whether weight files must stay inside it."""

    dir: Path
    confine: bool


def _check_inside(path: Path, rel: str, folder: Path, key: str, where: str, table: str) -> None:
    """Refuse a weight file outside the pipeline file's folder (``..``, an absolute path, a symlink)."""
    try:
        root = folder.resolve()
        target = path.resolve()  # follows every symlink on the way, the file's own included
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
        raise PipelineError(
            f"{where}: {table}: {key} file {rel!r} cannot be resolved: {exc}",
            hint="point it at a regular file inside the pipeline file's folder.",
        ) from None
    if not target.is_relative_to(root):
        via = "" if target == path.absolute() else f", which resolves to {str(target)!r}"
        raise PipelineError(
            f"{where}: {table}: {key} file {rel!r}{via} lies outside the pipeline file's folder {str(root)!r}",
            hint="weight files must lie inside the folder of the pipeline file (subfolders are fine): copy "
            "the file there (a symlink must point there too).",
        )


def _check_array(arr: np.ndarray, key: str, label: str, where: str, table: str, ndim: int) -> np.ndarray:
    if not np.issubdtype(arr.dtype, np.floating) and not np.issubdtype(arr.dtype, np.integer):
        raise PipelineError(f"{where}: {table}: {key} in {label} has non-numeric dtype {arr.dtype}")
    if arr.ndim != ndim:
        want = {3: "[O, C/groups, K]", 2: "[O, D]", 1: "[n]"}[ndim]
        raise PipelineError(
            f"{where}: {table}: {key} in {label} has shape {list(arr.shape)}, expected {ndim}-D {want}"
        )
    if 0 in arr.shape:
        raise PipelineError(f"{where}: {table}: {key} in {label} is empty (shape {list(arr.shape)})")
    arr = arr.astype(np.float64)
    if not np.isfinite(arr).all():
        raise PipelineError(f"{where}: {table}: {key} in {label} contains NaN or infinite values")
    return arr


# safetensors dtypes numpy holds; others (bfloat16, float8: torch's training dtypes) are read through torch
_NUMPY_SAFETENSORS = {"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"}


def _load_safetensors(path: Path, tensor_key: str | None, where: str, table: str, key: str) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        names = sorted(f.keys())
        if tensor_key is None:
            if len(names) != 1:
                raise PipelineError(
                    f"{where}: {table}: {str(path)!r} holds {len(names)} tensors ({', '.join(names)})",
                    hint=f'name one with {key}_key = "...".',
                )
            tensor_key = names[0]
        elif tensor_key not in names:
            raise PipelineError(
                f"{where}: {table}: {str(path)!r} has no tensor {tensor_key!r}",
                hint=f"it holds: {', '.join(names)}.",
            )
        dtype = f.get_slice(tensor_key).get_dtype()
        if dtype in _NUMPY_SAFETENSORS:
            return f.get_tensor(tensor_key)
    import torch

    try:
        with safe_open(str(path), framework="pt") as f:
            # float32 holds every bfloat16 and float8 value exactly
            return f.get_tensor(tensor_key).to(torch.float32).numpy()
    except Exception as exc:  # a dtype this torch cannot read either
        raise PipelineError(
            f"{where}: {table}: cannot read {key} {tensor_key!r} in {str(path)!r}: its dtype {dtype} is not "
            f"readable here ({first_line(exc)})",
            hint="save the weights as float32 (or float16): tensor.float() before save_file.",
        ) from None


# ------------------------------------------------------------------------------------------ resolving


def _stored(a: np.ndarray, dtype: str, what: str) -> np.ndarray:
    """The values as stored in ``dtype``, held as float32 for computing."""
    limit = FP16_MAX if dtype == "float16" else float(np.finfo(np.float32).max)
    if np.abs(a).max() > limit:
        raise PipelineError(
            f"{what}: a value of {np.abs(a).max():.4g} does not fit {dtype} (largest {limit:.6g})",
            hint='set weight_dtype = "float32" for it, or rescale the weights.'
            if dtype == "float16"
            else "rescale the weights.",
        )
    return a.astype(np.float16).astype(np.float32) if dtype == "float16" else a.astype(np.float32)


def tap_sums(w: np.ndarray) -> np.ndarray:
    """``w.astype(float64).sum(axis=2)``, tap by tap: 1.5 ms instead of 6 for a [256, 1024, 5] conv on the
    development VM (numpy reduces a short last axis slowly)."""
    acc = w[..., 0].astype(np.float64)
    for k in range(1, w.shape[2]):
        acc += w[..., k]
    return acc


def resolve(pipeline: Pipeline, input_names: tuple[str, ...] | list[str]) -> ResolvedPipeline:
    """Bind a pipeline to its input features: check widths and build the layers and output names.

    ``input_names`` are the source's features; ``[preprocess]`` select/select_regex picks some of them.
    """
    names = tuple(input_names)
    if (
        "" in names
    ):  # its outputs would be named ".diff1" (a store's is refused when it opens; frames, streams)
        raise ShapeError(f"feature {names.index('')} has an empty name", hint="name every feature.")
    columns = select_columns(pipeline.preprocess, names, pipeline.origin)
    if columns is not None:
        names = tuple(names[j] for j in columns)
    selected = names
    channels = len(names)
    layers: list[Layer] = []
    warm = [pipeline.preprocess.pre_halo if pipeline.preprocess else 0] * channels
    for i, stage in enumerate(pipeline.stages, start=1):
        what = f"{pipeline.origin}: [[conv]] #{i} ({stage.name})"
        bank = None
        if stage.filters is not None:
            bank = tuple(filter_spec(f) for f in stage.filters)
            weight = bank_weights(stage.filters, channels)
            groups = channels
            out_names = tuple(f"{n}.{f.label}" for n in names for f in bank)
            warm = [w + f.halo * stage.dilation for w in warm for f in bank]
        else:
            weight = stage.weight
            groups = channels if stage.groups == "depthwise" else int(stage.groups)
            if channels % groups:
                raise ShapeError(
                    f"{what}: groups = {groups} does not divide the {channels} input channels",
                    hint="groups must divide the number of channels the stage receives.",
                )
            if weight.shape[1] * groups != channels:
                raise ShapeError(
                    f"{what}: weights of shape {list(weight.shape)} with groups = {groups} expect "
                    f"{weight.shape[1] * groups} input channels, but the stage receives {channels}",
                    hint="weights must have shape [O, C/groups, K] where C is the number of input "
                    "features (for the first stage) or the previous stage's outputs.",
                )
            if weight.shape[0] % groups:
                raise ShapeError(
                    f"{what}: {weight.shape[0]} output channels are not a multiple of groups = {groups}"
                )
            out_names = tuple(f"{stage.name}.{o}" for o in range(weight.shape[0]))
            per_in, per_out = weight.shape[1], weight.shape[0] // groups
            reach = (weight.shape[2] - 1) * stage.dilation
            warm = [max(warm[(o // per_out) * per_in : (o // per_out + 1) * per_in]) + reach
                    for o in range(weight.shape[0])]  # fmt: skip
        layers.append(
            Layer(
                name=stage.name,
                weight=_stored(weight, stage.weight_dtype, f"{what}: weights"),
                # a bias is kept in float32 whatever the weights' storage: rounding it moves every output by
                # its whole rounding error (5% of an output's scale for a de-meaning bias near 100), unchecked
                bias=None if stage.bias is None else _stored(stage.bias, "float32", f"{what}: bias"),
                dilation=stage.dilation,
                groups=groups,
                activation=stage.activation,
                weight_dtype=stage.weight_dtype,
                given=np.asarray(weight, dtype=np.float64),
                tap_sums=tap_sums(weight),
                filters=bank,
            )
        )
        names, channels = out_names, weight.shape[0]
    halo = sum(layer.halo for layer in layers) + (pipeline.preprocess.pre_halo if pipeline.preprocess else 0)
    if halo > MAX_HALO:
        raise PipelineError(
            f"{pipeline.origin}: the receptive field spans {halo:,} steps (sum of (K - 1) * dilation), "
            f"more than the {MAX_HALO:,} a chunk can carry",
            hint="use smaller dilations or shorter filters.",
        )
    head = None
    if pipeline.head is not None:
        h = pipeline.head
        if h.weight.shape[0] != channels:
            raise ShapeError(
                f"{pipeline.origin}: [head]: weights of shape {list(h.weight.shape)} expect {h.weight.shape[0]} "
                f"inputs, but the last stage gives {channels}",
                hint="head weights must have shape [O, D] with O the last stage's output channels.",
            )
        head = HeadLayer(
            name=h.name,
            weight=_stored(h.weight, h.weight_dtype, f"{pipeline.origin}: [head]: weights"),
            bias=None if h.bias is None else _stored(h.bias, "float32", f"{pipeline.origin}: [head]: bias"),
            activation=h.activation,
            weight_dtype=h.weight_dtype,
            given=np.asarray(h.weight, dtype=np.float64),
        )
        names = tuple(f"{h.name}.{j}" for j in range(h.weight.shape[1]))
        warm = [max(warm)] * h.weight.shape[1]
    return ResolvedPipeline(
        pipeline=pipeline,
        layers=tuple(layers),
        head=head,
        input_names=selected,
        output_names=names,
        columns=columns,
        source_width=len(input_names),
        warmups=tuple(warm),
    )
