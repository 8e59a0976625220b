"""The test session's own configuration (tests/conftest.py)."""

from __future__ import annotations

import importlib.util

import pytest

from . import conftest


def test_the_conftest_loads_where_pytest_xdist_is_not() -> None:
    # its -n auto hook is xdist's: registered where xdist is absent or disabled (`-p no:xdist -o addopts=`, as
    # xdist's own advice for --pdb says), pytest stopped with INTERNALERROR "unknown hook"
    pm = pytest.PytestPluginManager()
    pm.register(conftest, name="tests.conftest")
    pm.check_pending()


@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="needs pytest-xdist")
def test_an_explicit_worker_count_for_n_auto_is_kept(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PYTEST_XDIST_AUTO_NUM_WORKERS (xdist's setting for -n auto) was overridden by the conftest's count
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "7")  # above the conftest's own cap of 4
    assert request.config.hook.pytest_xdist_auto_num_workers(config=request.config) == 7
