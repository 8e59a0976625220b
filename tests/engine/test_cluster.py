"""The local cluster of ``--workers`` (tsconv.engine.cluster): started early, taken by the run that matches it,
closed otherwise, its workers importing the engine as they start."""

from __future__ import annotations

import sys

import pytest

from tsconv.engine import cluster as cl

distributed = pytest.importorskip("distributed")


def _engine_imported() -> bool:
    return "tsconv.engine.distributed" in sys.modules


def test_an_early_cluster_is_taken_by_the_run_and_its_workers_have_the_engine_loaded() -> None:
    cl.start_early(1, "cpu")
    started = cl._early["thread"]
    cluster, threads = cl.local_cluster(1, "cpu")
    try:
        assert not started.is_alive() and cl._early is None
        assert threads >= 1 and len(cluster.workers) == 1
        with distributed.Client(cluster) as client:
            # before any task: the preload imported the engine in each worker as it started
            assert set(client.run(_engine_imported).values()) == {True}
    finally:
        cluster.close()


def _early_threads() -> list[str]:
    from tsconv.kernels import early

    return sorted(early._threads)


def test_gpu_workers_begin_their_gpu_start_up_in_the_preload_and_cpu_workers_do_not() -> None:
    # A GPU worker's spec on a machine without one: its preload starts the threads, which find no GPU and end.
    gpu_cluster, _ = cl._make(1, ["0"])
    cpu_cluster, _ = cl._make(1, [])
    try:
        with distributed.Client(gpu_cluster) as client:
            assert list(client.run(_early_threads).values()) == [["cuda", "triton"]]
        with distributed.Client(cpu_cluster) as client:
            assert list(client.run(_early_threads).values()) == [[]]
    finally:
        gpu_cluster.close()
        cpu_cluster.close()


def test_an_early_cluster_of_other_workers_is_closed_and_the_right_one_started() -> None:
    cl.start_early(1, "cpu")
    state = cl._early
    cluster, _ = cl.local_cluster(2, "cpu")
    try:
        assert len(cluster.workers) == 2
        early = state["result"][0]
        assert early is not cluster and early.status.name == "closed"
    finally:
        cluster.close()


def test_an_early_cluster_no_run_took_is_closed() -> None:
    cl.start_early(1, "cpu")
    state = cl._early
    cl.discard_early()
    assert cl._early is None and state["result"][0].status.name == "closed"
    cl.discard_early()  # nothing left: a no-op


@pytest.mark.parametrize("workers", [0, -1, True, "2", None])
def test_no_early_start_for_workers_the_run_refuses(workers) -> None:  # noqa: ANN001
    cl.start_early(workers, "cpu")
    assert cl._early is None
