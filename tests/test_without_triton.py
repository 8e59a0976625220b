"""A CPU run needs no Triton: with ``import triton`` blocked, CPU runs give the same bits as with it.

Triton publishes Linux wheels only, so on other hosts tsconv is installed without it. Each check runs in a
fresh interpreter (the test session has imported Triton already), once with a meta_path hook that makes
``import triton`` fail and once without, and compares what both wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

import tsconv

BLOCK = textwrap.dedent(
    """
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError(f"blocked: {name}")

    sys.meta_path.insert(0, Block())
    """
)

# argv: store, output folder. Every CPU entry point a user without Triton has: the CLI, process() with a
# dense conv + head (the engine's head paths), features() on numpy, the nn modules.
RUNS = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import numpy as np
    import torch
    import zarr

    import tsconv
    import tsconv.nn
    from tsconv.cli import main

    store, out = sys.argv[1], Path(sys.argv[2])
    rng = np.random.default_rng(3)
    dense = {
        "conv": [
            {"filters": ["ma:4", "dev:8"]},
            {"weights": rng.normal(size=(16, 8, 3)) / 8, "bias": rng.normal(size=16), "activation": "gelu"},
        ],
        "head": {"weights": rng.normal(size=(16, 3)), "activation": "tanh"},
    }
    main(["process", "-i", store, "-o", str(out / "default.zarr"), "--device", "cpu", "-q"],
         standalone_mode=False)
    tsconv.process(store, out / "dense.zarr", pipeline=dense, device="cpu")
    for name in ("default", "dense"):
        np.save(out / f"{name}.npy", zarr.open_group(out / f"{name}.zarr", mode="r")["values"][:])
    x = zarr.open_group(store, mode="r")["values"][:]
    np.save(out / "features_default.npy", tsconv.features(x, device="cpu"))
    np.save(out / "features_dense.npy", tsconv.features(x, dense, device="cpu"))
    xt = torch.from_numpy(x)
    with torch.no_grad():
        module = tsconv.nn.Pipeline.from_pipeline(dense, [f"f{i}" for i in range(x.shape[1])])
        np.save(out / "nn_pipeline.npy", module(xt).numpy())
        torch.manual_seed(0)
        conv = tsconv.nn.CausalConv1d(4, 8, 3, activation="relu")
        np.save(out / "nn_conv.npy", conv(xt.T).numpy())
    print("triton imported:", any(m == "triton" or m.startswith("triton.") for m in sys.modules))
    try:
        import triton  # noqa: F401
    except ImportError:
        print("triton importable: False")
    else:
        print("triton importable: True")
    """
)

OUTPUTS = ("default", "dense", "features_default", "features_dense", "nn_pipeline", "nn_conv")


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a host without Triton lacks it
    env["PYTHONPATH"] = str(Path(tsconv.__file__).parent.parent)
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture
def store(tmp_path: Path) -> str:
    rng = np.random.default_rng(0)
    x = (100 + 0.01 * np.cumsum(rng.standard_normal((3000, 4)), axis=0)).astype(np.float32)
    x[5:40, 1] = np.nan
    path = tmp_path / "in.zarr"
    zarr.open_group(path, mode="w", zarr_format=3).create_array("values", data=x, chunks=(1024, 4))
    return str(path)


def test_cpu_runs_without_triton_equal_runs_with_it(store: str, tmp_path: Path) -> None:
    results = {}
    for mode, code in (("blocked", BLOCK + RUNS), ("normal", RUNS)):
        out = tmp_path / mode
        out.mkdir()
        p = _python(code, store, str(out))
        assert p.returncode == 0, p.stderr[-3000:]
        results[mode] = {name: np.load(out / f"{name}.npy") for name in OUTPUTS}
        # no run imported Triton, and only the hook kept it from being importable (Triton is installed here)
        assert p.stdout.strip().splitlines()[-2:] == [
            "triton imported: False",
            f"triton importable: {mode == 'normal'}",
        ], (mode, p.stdout[-2000:])
    for name in OUTPUTS:
        blocked, normal = results["blocked"][name], results["normal"][name]
        assert blocked.dtype == np.float32 and blocked.shape == normal.shape and blocked.shape[0] > 0, name
        assert np.isfinite(blocked).any(), name
        np.testing.assert_array_equal(blocked, normal, err_msg=name)  # NaN-equal, bit for bit otherwise


def test_cuda_without_triton_is_one_error_line(store: str, tmp_path: Path) -> None:
    # torch's own CUDA check answers yes, so only the Triton check stands between the run and the device
    code = BLOCK + textwrap.dedent(
        """
        import runpy, sys
        import torch

        torch.cuda.is_available = lambda: True
        sys.argv = ["tsconv", *sys.argv[1:]]
        runpy.run_module("tsconv", run_name="__main__")
        """
    )
    for device in ("cuda", "auto"):
        p = _python(code, "process", "-i", store, "-o", str(tmp_path / f"{device}.zarr"), "--device", device)
        assert p.returncode != 0
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
        assert "needs Triton (pip install triton)" in lines[0] and "--device cpu" in lines[0], lines[0]
        assert f"device {device}" in lines[0], lines[0]
        assert not (tmp_path / f"{device}.zarr").exists()
