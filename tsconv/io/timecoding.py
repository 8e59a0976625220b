"""How an input's time array encodes instants, and its decoding to int64 nanoseconds since the epoch (UTC).

tsconv's ingested stores hold int64 nanoseconds without attributes; its outputs hold them with the CF
attributes :data:`NS_SINCE_EPOCH`. Stores written by xarray follow CF:
``units`` "<unit> since <reference datetime>" and ``calendar``, integer or float values, and a missing
time as NaT (int64 minimum), NaN or ``_FillValue``. zarr can also store numpy datetime64 directly.
Decoding is a vectorised multiply-add per block, so the time column is never read whole; the bounds are
checked in Python integers first, so a value that would overflow int64 nanoseconds is refused, never
wrapped. Floats are decoded as stored, rounded to the nearest ns: float64 keeps about 16 digits, so float
days since 1970 resolve only to a few hundred ns (xarray's own decoding differs from ours by that much).
"""

from __future__ import annotations

import base64
import re
import struct
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np

from tsconv.errors import StoreError

__all__ = ["EARLY_NS", "NS_SINCE_EPOCH", "TimeCoding", "iso_utc", "looks_early", "time_coding"]

_I64_MIN = int(np.iinfo(np.int64).min)
_I64_MAX = int(np.iinfo(np.int64).max)
_NS = {
    "ns": 1,
    "us": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
    "D": 86_400_000_000_000,
    "W": 7 * 86_400_000_000_000,
}
_UNIT_NAMES = {
    **dict.fromkeys(("days", "day", "d"), "D"),
    **dict.fromkeys(("hours", "hour", "hrs", "hr", "h"), "h"),
    **dict.fromkeys(("minutes", "minute", "mins", "min"), "m"),
    **dict.fromkeys(("seconds", "second", "secs", "sec", "s"), "s"),
    **dict.fromkeys(("milliseconds", "millisecond", "msecs", "msec", "ms"), "ms"),
    **dict.fromkeys(("microseconds", "microsecond", "usecs", "usec", "us"), "us"),
    **dict.fromkeys(("nanoseconds", "nanosecond", "nsecs", "nsec", "ns"), "ns"),
}
_CALENDARS = ("standard", "gregorian", "proleptic_gregorian")
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_GREGORIAN_START_NS = (date(1582, 10, 15).toordinal() - _EPOCH_ORDINAL) * _NS["D"]
_REF = re.compile(
    r"(?P<y>\d{1,4})-(?P<mo>\d{1,2})-(?P<d>\d{1,2})"
    r"(?:[T ]+(?P<h>\d{1,2}):(?P<mi>\d{1,2})(?::(?P<s>\d{1,2})(?:\.(?P<frac>\d*))?)?)?"
    r"\s*(?P<tz>Z|UTC|GMT|[+-]\d{1,2}(?::?\d{2})?)?",
    re.IGNORECASE,
)
# The CF attributes of tsconv's int64 ns since the epoch (UTC): written on the output's time so xarray decodes
# it to datetime64[ns]; :func:`time_coding` reads them back as 1 ns per unit from the epoch.
NS_SINCE_EPOCH = {"units": "nanoseconds since 1970-01-01", "calendar": "proleptic_gregorian"}
# Integers without a unit are read as ns, so epoch seconds, milliseconds and microseconds (these up to the
# year 2969) or step counts land within a year of 1970-01-01; real ns data almost never does. 1970-01-12
# (1e15 ns) would let today's epoch microseconds (1.8e15) through.
EARLY_NS = 365 * _NS["D"]
_FIX_UNITS = "write the store with times as datetime64 (xarray's default CF encoding), or as int64 ns"


@dataclass(frozen=True)
class TimeCoding:
    """Stored time value v -> nanoseconds since the epoch: ``ref_ns + v * ns_per_unit`` (floats rounded).

    ``missing``: stored values that mean "no time" besides NaN and NaT; ``cf``: NaT (int64 minimum) is
    missing too. ``identity``: int64 nanoseconds stored as they are (tsconv's own layout)."""

    dtype: np.dtype
    ns_per_unit: int = 1
    ref_ns: int = 0
    missing: tuple[int | float, ...] = ()
    cf: bool = False
    description: str = "int64 ns since the epoch"

    @property
    def identity(self) -> bool:
        return self.dtype == np.int64 and not self.cf and self.ns_per_unit == 1 and self.ref_ns == 0

    def decode(self, raw: np.ndarray, row0: int = 0, *, where: str = "'time'") -> np.ndarray:
        """``raw`` (stored values of rows row0, row0 + 1, ...) as int64 ns; a StoreError names the first
        row that is missing or out of range."""
        raw = np.asarray(raw)
        if self.identity or raw.size == 0:
            return raw.astype(np.int64, copy=False)
        kind = raw.dtype.kind
        if kind == "M":
            raw = raw.view(np.int64)
            kind = "i"
        missing = self._missing(raw, kind)
        if missing is not None and missing.any():
            row = row0 + int(np.argmax(missing))
            raise StoreError(
                f"{where}: the time of row {row:,} is missing (NaT, NaN or the fill value)",
                hint="every row needs a timestamp: drop or fill the rows without one and write the store again.",
            )
        if kind == "u" and raw.dtype.itemsize == 8 and int(raw.max()) > _I64_MAX:
            row = row0 + int(np.argmax(raw > _I64_MAX))
            raise StoreError(
                f"{where}: row {row:,} holds {int(raw[row - row0])}, above the int64 maximum 2^63-1",
                hint="times are int64 nanoseconds since the epoch (1677-09-21 .. 2262-04-11); "
                "store them as int64.",
            )
        f = self.ns_per_unit
        q, r = divmod(self.ref_ns, f)  # ns = (v + q) * f + r, so v * f alone never has to fit int64
        if kind == "f":
            v = raw.astype(np.float64, copy=False)
            whole = np.floor(v)
            # an infinite time (a float16 past 65504) is refused below, by row: not numpy's warnings first
            with np.errstate(invalid="ignore"):
                extra = np.rint((v - whole) * f).astype(np.int64)  # 0 .. f: the fraction, rounded to ns
            slack = f
        else:
            whole, extra, slack = raw, None, 0
        v_lo = -(_I64_MAX // f) - q  # ceil((int64 min + 1) / f) - q: NaT stays unreachable
        v_hi = (_I64_MAX - r - slack) // f - q
        lo, hi = whole.min(), whole.max()
        q_fits = _I64_MIN <= q <= _I64_MAX
        fits = q_fits and bool(np.isfinite(lo) and np.isfinite(hi))
        if not (fits and v_lo <= int(lo) and int(hi) <= v_hi):
            # the first row out of range, an infinite one included (not row 0 for every row)
            bad = ~((whole >= v_lo) & (whole <= v_hi)) if q_fits else np.ones(raw.shape, dtype=bool)
            row = row0 + int(np.argmax(bad))
            raise StoreError(
                f"{where}: row {row:,} holds {raw[row - row0].item()!r} ({self.description}), outside the "
                "int64 nanosecond range 1677-09-21 .. 2262-04-11",
                hint="tsconv keeps times as int64 ns since the epoch; store times within that range.",
            )
        ns = (whole.astype(np.int64) + np.int64(q)) * np.int64(f)
        ns += np.int64(r)
        if extra is not None:
            ns += extra
        return ns

    def _missing(self, raw: np.ndarray, kind: str) -> np.ndarray | None:
        mask = None
        if kind == "f":
            mask = np.isnan(raw)
            marks: list[float] = [float(m) for m in self.missing]
        else:
            if self.cf and raw.dtype == np.int64:
                mask = raw == _I64_MIN
            info = np.iinfo(raw.dtype)
            marks = [int(m) for m in self.missing if float(m).is_integer() and info.min <= m <= info.max]
        if marks:
            hit = np.isin(raw, np.asarray(marks, dtype=raw.dtype))
            mask = hit if mask is None else mask | hit
        return mask


def time_coding(array: Any, *, where: str = "'time'") -> TimeCoding:
    """The coding of a 1-D zarr time array, from its dtype and CF attributes; StoreError when unsupported."""
    dt = np.dtype(array.dtype)
    attrs = dict(getattr(array, "attrs", None) or {})
    if dt.kind == "M":
        unit, count = np.datetime_data(dt)
        if unit not in _NS:
            raise StoreError(
                f"{where}: dtype {dt} counts {unit!r} units, which have no fixed length in nanoseconds",
                hint="store the times as datetime64[ns] (or s, ms, us).",
            )
        return TimeCoding(dt, _NS[unit] * count, 0, cf=True, description=str(dt))
    if dt.kind not in "iuf":
        raise StoreError(
            f"{where}: the time array has dtype {dt}, expected int64 nanoseconds, datetime64, or numbers "
            "with CF units",
            hint=_FIX_UNITS + ".",
        )
    # xarray applies these before decoding the times; the identity (a scale of 1, an offset of 0, _Unsigned as
    # the dtype says) changes nothing
    identity = {"scale_factor": 1, "add_offset": 0, "_Unsigned": "true" if dt.kind == "u" else "false"}
    packed = [
        k for k, v in identity.items() if k in attrs and str(attrs[k]).lower() != str(v) and attrs[k] != v
    ]
    if packed:
        raise StoreError(
            f"{where}: the time array is CF-packed ({', '.join(f'{k}={attrs[k]!r}' for k in packed)}), which "
            "xarray applies before decoding the times; tsconv decodes stored times as they are",
            hint=_FIX_UNITS + " (xarray: drop scale_factor/add_offset from the time variable's encoding).",
        )
    units = attrs.get("units")
    if units is None:
        if dt.kind == "f":
            raise StoreError(
                f"{where}: the time array holds floats ({dt}) but has no 'units' attribute",
                hint="add CF units such as 'seconds since 1970-01-01', or store int64 nanoseconds.",
            )
        if dt.itemsize < 8:  # as ns, int32 reaches only 2.1 s from 1970: these count some other unit
            info = np.iinfo(dt)
            raise StoreError(
                f"{where}: the time array holds {dt} values but has no 'units' attribute; without units "
                f"tsconv reads int64 nanoseconds since the epoch, and as nanoseconds {dt} spans only "
                f"{iso_utc(int(info.min))} .. {iso_utc(int(info.max))}",
                hint="add CF units naming what the integers count, such as 'seconds since 1970-01-01' or "
                "'milliseconds since 1970-01-01' (zarr: group['time'].attrs['units'] = ...), or store int64 "
                "nanoseconds.",
            )
        return TimeCoding(dt, description=f"{dt} nanoseconds since the epoch")
    if not isinstance(units, str):
        raise StoreError(f"{where}: the time array's 'units' attribute is {units!r}, expected a string")
    calendar = attrs.get("calendar")
    cal = str(calendar).lower() if calendar is not None else "standard"
    if cal not in _CALENDARS:
        raise StoreError(
            f"{where}: the time array uses calendar {calendar!r}; tsconv decodes only "
            f"{', '.join(_CALENDARS)}",
            hint="convert the times to the standard calendar (e.g. xarray's ds.convert_calendar('standard')) "
            "and write the store again.",
        )
    unit, ref_ns = _parse_units(units, where)
    if cal != "proleptic_gregorian" and ref_ns < _GREGORIAN_START_NS:
        raise StoreError(
            f"{where}: units {units!r} with calendar {cal!r} count from before 1582-10-15, where that "
            "calendar is Julian",
            hint="use calendar 'proleptic_gregorian', or a reference date after 1582-10-15.",
        )
    missing = _missing_values(array, attrs, dt)
    desc = f"{units!r}" + (f", calendar {calendar!r}" if calendar is not None else "")
    return TimeCoding(dt, _NS[unit], ref_ns, missing, cf=True, description=desc)


def looks_early(first_ns: int, last_ns: int) -> bool:
    """Whether times from ``first_ns`` to ``last_ns`` all lie within :data:`EARLY_NS` of the epoch, where
    integers of another unit read as ns land."""
    return -EARLY_NS < min(first_ns, last_ns) and max(first_ns, last_ns) < EARLY_NS


def _parse_units(units: str, where: str) -> tuple[str, int]:
    """(numpy unit, reference instant in ns since the epoch UTC) of CF units "<unit> since <date>"."""
    bad = StoreError(
        f"{where}: cannot read the time units {units!r}; expected '<unit> since <date>' with unit days, "
        "hours, minutes, seconds, milliseconds, microseconds or nanoseconds and a date like "
        "'2026-01-02 00:00:00'",
        hint=_FIX_UNITS + ".",
    )
    head, sep, tail = units.strip().partition(" since ")
    unit = _UNIT_NAMES.get(head.strip().lower())
    m = _REF.fullmatch(tail.strip())
    if not sep or unit is None or m is None:
        raise bad
    g = m.groupdict()
    try:
        day = date(int(g["y"]), int(g["mo"]), int(g["d"])).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        raise bad from None
    h, mi, s = int(g["h"] or 0), int(g["mi"] or 0), int(g["s"] or 0)
    if h > 23 or mi > 59 or s > 59:
        raise bad
    frac = int((g["frac"] or "").ljust(9, "0")[:9])
    ns = ((day * 24 + h) * 60 + mi) * 60 * 10**9 + s * 10**9 + frac
    tz = (g["tz"] or "").upper()
    if tz and tz not in ("Z", "UTC", "GMT"):
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        oh, om = (int(digits[:-2]), int(digits[-2:])) if len(digits) > 2 else (int(digits), 0)
        ns -= sign * (oh * 60 + om) * 60 * 10**9  # local time = UTC + offset
    return unit, ns


def _missing_values(array: Any, attrs: dict[str, Any], dt: np.dtype) -> tuple[int | float, ...]:
    """The stored values meaning "missing": ``_FillValue`` / ``missing_value`` attributes, and in an array
    xarray wrote in zarr format 2 (``_ARRAY_DIMENSIONS``) the array's fill value, where xarray puts
    ``_FillValue``. Elsewhere the fill value is only zarr's default for unwritten chunks: 0 in format 2, which
    a plain zarr store's "days since its first day" time holds at row 0."""
    found: list[Any] = []
    for key in ("_FillValue", "missing_value"):
        v = attrs.get(key)
        found.extend(v if isinstance(v, list) else [v])
    meta = getattr(array, "metadata", None)
    if getattr(meta, "zarr_format", None) == 2 and "_ARRAY_DIMENSIONS" in attrs:
        found.append(getattr(meta, "fill_value", None))
    out: list[int | float] = []
    for v in found:
        if isinstance(v, str) and dt.kind == "f":  # xarray's zarr 3 encoding of float fill values
            try:
                v = struct.unpack("<d", base64.standard_b64decode(v))[0]
            except (ValueError, struct.error):
                continue
        if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
            if not np.isnan(v):
                out.append(float(v) if dt.kind == "f" else int(v))
    return tuple(out)


def iso_utc(ns: int) -> str:
    """ns since the epoch as ISO 8601 in UTC, to the nanosecond, trailing zeros of the fraction dropped (through a
    float of seconds it was rounded to the microsecond, sometimes up: a store ending at 23:59:59.9999997 on 31
    December was shown ending in the next year)."""
    seconds, frac = divmod(int(ns), 10**9)
    text = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)).isoformat()  # ends in +00:00
    if frac:
        text = f"{text[:-6]}.{f'{frac:09d}'.rstrip('0')}{text[-6:]}"
    return text
