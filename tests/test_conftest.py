"""The test session's own configuration (tests/conftest.py)."""

from __future__ import annotations

import pytest

from . import conftest


def test_the_conftest_loads_where_pytest_xdist_is_not() -> None:
    # its -n auto hook is xdist's: registered where xdist is absent or disabled (`-p no:xdist -o addopts=`, as
    # xdist's own advice for --pdb says), pytest stopped with INTERNALERROR "unknown hook"
    pm = pytest.PytestPluginManager()
    pm.register(conftest, name="tests.conftest")
    pm.check_pending()
