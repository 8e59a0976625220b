"""Nothing lost, nothing mixed, under kill -9 at seeded points: the loop of tests/faultloop.py.

The default run kills one ``process`` then its ``--resume``, one ``process --overwrite``, one
``process --update`` and one ``ingest --append`` (a few seconds after the one-off start of the step
server and the references); the slow run takes 25 rounds over all six operations, and 5 more in a fresh interpreter per step.
benchmarks/faults.py runs hundreds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import faultloop

SEED = 28


def _assert_all_recovered(rounds: list[faultloop.Round]) -> None:
    failed = [(r.op, r.round, r.seed, r.error, r.steps) for r in rounds if not r.ok]
    assert not failed, f"rounds that did not end with the uninterrupted result: {failed}"
    for r in rounds:  # every kill landed: a round whose first step ran to the end tests no recovery
        assert r.steps[0]["killed"], (r.op, r.steps)


def test_kill_9_at_seeded_points_then_the_next_step_gives_the_uninterrupted_result(tmp_path: Path) -> None:
    ops = ("process --resume", "process --overwrite", "process --update", "ingest --append")
    with faultloop.Runner() as runner:
        w = faultloop.make_world(tmp_path / "w", runner, ops)
        rounds = [faultloop.run_round(runner, w, k, SEED, op) for k, op in enumerate(ops)]
    _assert_all_recovered(rounds)
    assert sum(s["killed"] for r in rounds for s in r.steps) >= 4


@pytest.mark.slow
def test_the_fault_loop_over_every_operation(tmp_path: Path) -> None:
    summary = faultloop.run_loop(tmp_path / "w", rounds=25, seed=SEED)
    assert summary["failures"] == [] and summary["rounds"] == 25
    assert set(summary["by_op"]) == set(faultloop.OPS) and summary["kills"] >= 25


@pytest.mark.slow
def test_the_fault_loop_in_a_fresh_interpreter_per_step(tmp_path: Path) -> None:
    summary = faultloop.run_loop(tmp_path / "w", rounds=5, seed=SEED + 1, exec=True)
    assert summary["failures"] == [] and summary["kills"] >= 5
