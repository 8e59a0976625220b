"""What ``tsconv plot`` draws: chosen features of a store against time, with the inputs they came from.

For a tsconv output, each panel also shows, on its right axis, the input series the feature was computed
from (an output name is its input's name and the filter's label: ``AAPL.px.diff1`` from ``AAPL.px``); the
input store is the one the output's ``source`` attribute names. matplotlib is optional: it is imported
here, on use, and drawn through its Agg backend without touching pyplot's global state.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tsconv.errors import StoreError, TsconvError, TsconvWarning
from tsconv.io.ffill import forward_fill
from tsconv.io.names import matching
from tsconv.io.store import InputStore, group_attrs, open_input
from tsconv.io.timecoding import iso_utc
from tsconv.pipeline.filters import filter_spec

__all__ = ["PlotResult", "MAX_PANELS", "MAX_POINTS", "parse_rows", "match_features", "plot_store"]

MAX_PANELS = 32  # features per figure
MAX_POINTS = 20_000  # points per line; longer ranges are drawn every k-th row
_FORMATS = (".png", ".svg", ".pdf")


@dataclass(frozen=True)
class PlotResult:
    """What a plot drew: the figure's path, the features, their inputs and the rows."""

    output: str
    features: tuple[str, ...]
    inputs: tuple[str, ...]  # the input series drawn beside them (empty: none found or not reachable)
    start: int
    stop: int
    every: int  # rows per point drawn

    def summary(self) -> str:
        inputs = f" with their inputs ({', '.join(self.inputs)})" if self.inputs else ""
        every = f", every {_ordinal(self.every)} row" if self.every > 1 else ""
        return (
            f"plotted {len(self.features)} feature{'s' * (len(self.features) != 1)}{inputs}, rows "
            f"{self.start:,}..{self.stop:,}{every} -> {self.output}"
        )


def parse_rows(text: str) -> slice:
    """``"A:B"`` as a slice (either side optional, negative counts from the end, as in Python)."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError(text)
        a, b = (int(p) if p.strip() else None for p in parts)
    except ValueError:
        raise TsconvError(
            f"--rows {text!r} is not a row range A:B",
            hint="give integers on either side of one colon, either side optional: 1000:2000, :500, -100:.",
        ) from None
    return slice(a, b)


def match_features(names: Sequence[str], patterns: Sequence[str]) -> list[str]:
    """The names any of ``patterns`` picks, in the store's order: a feature's own name, else a glob (fnmatch,
    case-sensitive)."""
    if not patterns:
        raise TsconvError("no feature pattern given", hint="pass --features PATTERN, e.g. --features 'x0.*'.")
    chosen = [names[j] for j in matching(names, patterns)]
    if not chosen:
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        asked = ", ".join(repr(p) for p in patterns)
        raise TsconvError(f"no feature matches {asked}", hint=f"the store's features are: {shown}.")
    if len(chosen) > MAX_PANELS:
        raise TsconvError(
            f"{len(chosen):,} features match {', '.join(repr(p) for p in patterns)}; a figure draws at most "
            f"{MAX_PANELS}",
            hint=f"narrow the pattern (the first matches: {', '.join(chosen[:4])}, ...).",
        )
    return chosen


def plot_store(
    store: str | os.PathLike[str],
    *,
    features: Sequence[str],
    output: str | os.PathLike[str],
    rows: str | slice | None = None,
) -> PlotResult:
    """Draw the features of ``store`` matching the glob patterns ``features`` over ``rows`` into ``output``.

    ``output``: a .png, .svg or .pdf file. ``rows``: a slice or ``"A:B"`` (default: all rows). The x axis
    is the decoded time where the store has times, else the row number. For a tsconv output the input
    series each feature was computed from is drawn beside it, forward filled as the pipeline read it (as
    stored where its ``[preprocess]`` sets ``fill = "none"``); when the input store cannot be read, or its
    times for the rows drawn are not the output's (rewritten since), the features are drawn alone and a
    :class:`TsconvWarning` says why.
    """
    out = Path(output)
    if out.suffix.lower() not in _FORMATS:
        raise TsconvError(
            f"{str(out)!r}: cannot tell the figure's format from its name",
            hint=f"end the output's name with {', '.join(_FORMATS)}.",
        )
    figure_cls, canvas_cls = _matplotlib()
    src = open_input(store)
    _refuse_inside(out, src)
    names = match_features(src.features, features)
    span = parse_rows(rows) if isinstance(rows, str) else (rows or slice(None))
    if span.step not in (None, 1):
        raise TsconvError("--rows takes a range A:B without a step")
    a, b, _ = span.indices(src.rows)
    if b <= a:
        raise TsconvError(
            f"rows {a:,}..{b:,} select nothing: the store has {src.rows:,} rows",
            hint="give --rows A:B with A < B, as a Python slice (either side optional).",
        )
    every = max(1, math.ceil((b - a) / MAX_POINTS))
    x = _x_axis(src, a, b, every)
    cols = [src.features.index(n) for n in names]
    y = _read(src, cols, a, b, every)
    pairs = _inputs(src, names, a, b, every)

    fig = figure_cls(figsize=(11, 2.2 * len(names) + 0.6), layout="constrained")
    canvas_cls(fig)
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    for j, (ax, name) in enumerate(zip(axes, names, strict=True)):
        ax.plot(x, y[:, j], color="C0", linewidth=0.8, label=name)
        ax.set_ylabel(name, color="C0")
        ax.grid(True, alpha=0.3)
        if name in pairs:
            input_name, series = pairs[name]
            twin = ax.twinx()
            twin.plot(x, series, color="0.45", linewidth=0.8, label=input_name)
            twin.set_ylabel(f"input {input_name}", color="0.45")
            ax.set_zorder(twin.get_zorder() + 1)  # the feature over its input
            ax.patch.set_visible(False)
    axes[-1].set_xlabel("time (UTC)" if src.time is not None else "row")
    every_words = f", every {_ordinal(every)} row" if every > 1 else ""
    fig.suptitle(f"{src.path.name}: rows {a:,}..{b:,}{every_words}", fontsize="medium")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    drawn_inputs = tuple(dict.fromkeys(pairs[n][0] for n in names if n in pairs))
    return PlotResult(
        output=str(out), features=tuple(names), inputs=drawn_inputs, start=a, stop=b, every=every
    )


def _refuse_inside(out: Path, src: InputStore) -> None:
    """Refuse a figure inside the plotted store, or inside the input store a tsconv output came from (whose
    series are drawn beside its features)."""
    from tsconv.io.objstore import refuse_inside

    source = group_attrs(src).get("source")
    stores = [("plotted store", src.root)] + ([("input store", source)] if isinstance(source, str) else [])
    refuse_inside(out, stores, flag="--output")


def _matplotlib() -> tuple[Any, Any]:
    """matplotlib's Figure and Agg canvas, or an error naming the extra that installs it."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise TsconvError(
            "plotting needs matplotlib, which is not installed",
            hint="pip install 'tsconv-features[plot]' (or pip install matplotlib).",
        ) from None
    return Figure, FigureCanvasAgg


def _x_axis(store: InputStore, a: int, b: int, every: int) -> np.ndarray:
    if store.time is None:
        return np.arange(a, b, every)
    return np.asarray(store.time[a:b])[::every].astype("datetime64[ns]")


def _read(store: InputStore, cols: list[int], a: int, b: int, every: int) -> np.ndarray:
    values = store.values.get_orthogonal_selection((slice(a, b, every), cols))
    return np.asarray(values, dtype=np.float64)


def _fills(run: Any) -> bool:
    """Whether the recorded pipeline forward-fills its input (the default; ``[preprocess] fill = "none"`` not)."""
    pre = run.get("preprocess") if isinstance(run, dict) else None
    return not (isinstance(pre, dict) and pre.get("fill") == "none")


def _read_filled(store: InputStore, cols: list[int], a: int, b: int, every: int) -> np.ndarray:
    """Rows ``a, a + every, ...`` below ``b`` of the columns ``cols``, forward filled per column from the last
    value before row ``a`` (NaN before a column's first value), as the engine fills them. Read a band of
    whole chunks at a time (each decoded once, not once a band) and thinned band by band."""
    chunk = max(1, int(store.values.chunks[0]))
    band = chunk * max(1, _FILL_BAND_ROWS // chunk)
    last = _last_values_before(store, cols, a, band)
    parts = []
    for start in range(a - a % chunk, b, band):
        lo, hi = max(a, start), min(b, start + band)
        raw = np.asarray(store.values.get_orthogonal_selection((slice(lo, hi), cols)), dtype=np.float64)
        block, last = forward_fill(raw, last)
        parts.append(block[(a - lo) % every :: every])
    return np.concatenate(parts).astype(np.float64, copy=False)


_FILL_BAND_ROWS = 65_536  # rows read at a time for a filled input (32 columns of float64: 16 MB)


def _last_values_before(store: InputStore, cols: list[int], row: int, band: int) -> np.ndarray:
    """Per column, its last non-NaN value in rows < ``row`` (NaN where it has none), read back a band at a
    time until every column has one or row 0 is reached."""
    last = np.full(len(cols), np.nan)
    missing = np.ones(len(cols), dtype=bool)
    stop = row
    while stop > 0 and missing.any():
        start = max(0, (stop - 1) // band * band)
        block = np.asarray(
            store.values.get_orthogonal_selection((slice(start, stop), cols)), dtype=np.float64
        )
        valid = ~np.isnan(block)
        has = missing & valid.any(axis=0)
        at = block.shape[0] - 1 - np.argmax(valid[::-1], axis=0)  # each column's last valid row
        last[has] = block[at[has], np.flatnonzero(has)]
        missing &= ~has
        stop = start
    return last


def _bank_labels(run: Any) -> list[set[str]] | None:
    """Per stage of the recorded pipeline, its filters' labels, when each output comes from one input: filter
    banks only, no head (a dense stage mixes every input, whatever its name); None otherwise. An output's
    name is its input's name and one label per stage, so ``a.diff1.ma8`` came from ``a``, not from an input
    named ``a.diff1``."""
    if not isinstance(run, dict) or run.get("head") is not None:
        return None
    stages = run.get("stages")
    if not (
        isinstance(stages, list) and stages and all(isinstance(s, dict) and "filters" in s for s in stages)
    ):
        return None
    try:
        return [{filter_spec(f).label for f in s["filters"]} for s in stages]
    except (TsconvError, TypeError):  # bookkeeping edited or damaged: no pairing rather than a wrong one
        return None


def _input_of(name: str, labels: list[set[str]], inputs: set[str]) -> str | None:
    """The input feature ``name`` was computed from: ``name`` less one ``.label`` per stage (labels hold no
    dot), or None when its suffixes are not the stages' labels."""
    parent, *suffixes = name.rsplit(".", len(labels))
    if len(suffixes) != len(labels) or not all(x in s for x, s in zip(suffixes, labels, strict=True)):
        return None
    return parent if parent in inputs else None


def _inputs(
    store: InputStore, names: list[str], a: int, b: int, every: int
) -> dict[str, tuple[str, np.ndarray]]:
    """For a tsconv output: per feature name, its input feature's name and rows; {} for other stores."""
    attrs = group_attrs(store)
    meta, source = attrs.get("tsconv"), attrs.get("source")
    labels = _bank_labels(attrs.get("pipeline"))
    if not isinstance(meta, dict) or not isinstance(source, str) or labels is None:
        return {}
    try:
        src = open_input(source)
    except (StoreError, OSError) as exc:
        warnings.warn(
            f"the input store {source} is not readable ({getattr(exc, 'message', exc)}); drawing the features alone",
            TsconvWarning,
            stacklevel=3,
        )
        return {}
    try:
        first = int((meta.get("input_rows") or [0])[0])
    except (TypeError, ValueError, IndexError, KeyError):  # bookkeeping edited or damaged
        warnings.warn(
            f"the output's tsconv.input_rows ({meta.get('input_rows')!r}) is not a row range; drawing the features alone",
            TsconvWarning,
            stacklevel=3,
        )
        return {}
    if first + b > src.rows:
        warnings.warn(
            f"the input store {source} has {src.rows:,} rows, fewer than the output's rows come from; "
            "drawing the features alone",
            TsconvWarning,
            stacklevel=3,
        )
        return {}
    inputs = set(src.features)
    wanted = {name: parent for name in names if (parent := _input_of(name, labels, inputs)) is not None}
    order = list(dict.fromkeys(wanted.values()))
    if not order:
        return {}
    if store.time is not None and src.time is not None:
        ours = np.asarray(store.time[a:b])[::every]
        theirs = np.asarray(src.time[first + a : first + b])[::every]
        if not np.array_equal(ours, theirs):
            # read by row number, a rewritten input would draw other rows on the output's time axis
            k = int(np.flatnonzero(ours != theirs)[0])
            warnings.warn(
                f"the input store {source} no longer matches the output's rows: its time at output row "
                f"{a + k * every:,} is {iso_utc(int(theirs[k]))}, the output's {iso_utc(int(ours[k]))} (was the "
                "input rewritten since?); drawing the features alone (compute the output again, with "
                "--overwrite, to draw it beside its inputs)",
                TsconvWarning,
                stacklevel=3,
            )
            return {}
    cols = [src.features.index(n) for n in order]
    # the input as the pipeline read it: forward filled unless its [preprocess] says fill = "none". Drawn as
    # stored, a symbol's ticks between other symbols' rows (a long layout's store) were isolated points
    # between NaNs, which a line does not draw: the input beside its features was mostly or wholly missing.
    if _fills(attrs.get("pipeline")):
        y = _read_filled(src, cols, first + a, first + b, every)
    else:
        y = _read(src, cols, first + a, first + b, every)
    series = {n: y[:, j] for j, n in enumerate(order)}
    return {name: (parent, series[parent]) for name, parent in wanted.items()}


def _ordinal(n: int) -> str:
    """2nd, 3rd, 11th, 1,021st."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"
