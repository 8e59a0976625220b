"""Test configuration.

TRITON_INTERPRET must be set before the first ``@triton.jit`` decorator runs, so it is set here, at import
time of the test session, whenever no CUDA GPU is present: Triton kernels then run on CPU tensors through
the interpreter. On a GPU machine the real kernels run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# optional: the hook is pytest-xdist's, and where xdist is absent or disabled (`-p no:xdist`) pytest stopped at an
# "unknown hook" INTERNALERROR before running any test
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """Workers for ``-n auto``: none on a GPU machine, where the tests share one device and some time it; else
    one per core, at most 4 (each worker's engine runs threads of its own). A count the user set in xdist's
    PYTEST_XDIST_AUTO_NUM_WORKERS is left to xdist (None), which reads it: this hook took precedence over it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    if torch.cuda.is_available():
        return 0
    return max(
        1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        # Triton runs compiled here, and CPU tensors cannot reach its kernels: the gpu tests run them
        skip = pytest.mark.skip(
            reason="Triton kernels interpreted on CPU tensors; here the gpu tests run them on the device"
        )
        marker = "interpreted"
    else:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        marker = "gpu"
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_launch_plans() -> None:
    """Each test starts without the launch plans earlier tests recorded: a plan skips the launcher's
    validation, tuner and internals, which tests monkeypatch."""
    from tsconv.kernels import gemm
    from tsconv.kernels.conv1d import state

    state.PLANS.clear()
    gemm._PLANS.clear()


@pytest.fixture(params=["native", "python"])
def file_reads(request: pytest.FixtureRequest) -> Iterator[str]:
    """Files read by the native batch reader (tsconv.io.readers.fileread) or by Python (the native_read
    setting off)."""
    from tsconv import config
    from tsconv.io.readers import fileread

    if request.param == "native" and fileread.native_reader() is None:
        pytest.skip(f"no native reader here: {fileread.unavailable_reason()}")
    with config.override(native_read=request.param == "native"):
        yield request.param
