"""The tuner's cross-check: a candidate whose output disagrees with the first candidate's never wins."""

from __future__ import annotations

import math

import pytest
import torch

from tsconv.kernels import autotune


def _space(names: list[str]) -> autotune.ConfigSpace:
    cfgs = tuple(autotune.Config(n, {"X": i}) for i, n in enumerate(names))
    return autotune.ConfigSpace("check_test_v1", cfgs, cfgs[0], cfgs[0])


def _bench(out: torch.Tensor, x: torch.Tensor):  # noqa: ANN202
    """Launch stand-ins writing out = 2 x: "good" fully, "half" only the first half (the rest stays as it
    was), "wrong" with a 5% error, "other" into a new tensor each call."""

    def bench(cfg: autotune.Config) -> object:
        if cfg.name == "half":
            out[: out.shape[0] // 2] = 2 * x[: out.shape[0] // 2]
        elif cfg.name == "wrong":
            out.copy_(2.1 * x)
        elif cfg.name == "other":
            return 2 * x
        elif cfg.name == "nothing":
            return None
        else:
            out.copy_(2 * x + 1e-7 * cfg.meta["X"])  # rounding differences are fine
        return out

    return bench


def _x(device: str = "cpu") -> torch.Tensor:
    x = 100 + torch.randn(64, 8, device=device).cumsum(0)
    x[3, 2] = math.nan  # a NaN input gives a NaN output in every candidate: not a disagreement
    return x


def test_cross_check_flags_unwritten_and_wrong_outputs() -> None:
    x = _x()
    out = torch.empty_like(x)
    bench = _bench(out, x)
    cfg = {n: autotune.Config(n, {"X": i}) for i, n in enumerate(["good", "good2", "half", "wrong", "other"])}
    ref, why = autotune._cross_check(bench, cfg["good"], bench(cfg["good"]), None)
    assert why is None and ref is not None and torch.equal(torch.isnan(ref), torch.isnan(x))
    assert autotune._cross_check(bench, cfg["good2"], bench(cfg["good2"]), ref)[1] is None
    # the half that "half" leaves alone still holds the previous (right) values: only the poison shows it
    why = autotune._cross_check(bench, cfg["half"], bench(cfg["half"]), ref)[1]
    assert why is not None and why.startswith("256 outputs NaN")
    why = autotune._cross_check(bench, cfg["wrong"], bench(cfg["wrong"]), ref)[1]
    assert why is not None and "max difference" in why
    # outputs the tuner cannot poison are not checked
    assert autotune._cross_check(bench, cfg["other"], bench(cfg["other"]), ref) == (ref, None)


@pytest.mark.gpu
def test_a_fast_candidate_with_wrong_output_never_wins() -> None:
    x = _x("cuda")
    out = torch.empty_like(x)
    space = _space(["good", "half", "wrong", "nothing"])
    cfg, record = autotune._tune(space, _bench(out, x), torch.device("cuda"), warmup_ms=5, rep_ms=20)
    assert cfg.name in ("good", "nothing"), record
    assert record["timings_ms"]["half"] is None and record["timings_ms"]["wrong"] is None, record
