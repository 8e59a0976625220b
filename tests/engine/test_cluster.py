"""The local cluster of ``--workers`` (tsconv.engine.cluster): started early, taken by the run that matches it,
closed otherwise, its workers importing the engine as they start."""

from __future__ import annotations

import sys

import pytest

from tsconv.engine import cluster as cl
from tsconv.errors import TsconvError

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


def _worker_env() -> tuple[int, str | None]:
    import os

    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")


def test_gpu_workers_begin_their_gpu_start_up_in_the_preload_and_cpu_workers_do_not() -> None:
    """Two GPUs: a worker process each, on its own GPU. One GPU: its worker runs in this process (no second
    interpreter's start-up inside the command). CPU workers are processes that start nothing of the GPU."""
    import os

    # GPU workers' specs on a machine without GPUs: their preloads start the threads, which find no GPU and end.
    gpu_cluster, _ = cl._make(2, ["0", "1"])
    one_gpu, threads = cl._make(1, ["3"])
    cpu_cluster, _ = cl._make(1, [])
    try:
        with distributed.Client(gpu_cluster) as client:
            assert list(client.run(_early_threads).values()) == [["cuda", "triton"]] * 2
            envs = client.run(_worker_env).values()
            assert sorted(e[1] for e in envs) == ["0", "1"] and os.getpid() not in {e[0] for e in envs}
        with distributed.Client(one_gpu) as client:
            assert threads is None and list(client.run(_worker_env).values())[0][0] == os.getpid()
            assert list(client.run(_early_threads).values()) == [["cuda", "triton"]]
        with distributed.Client(cpu_cluster) as client:
            assert list(client.run(_early_threads).values()) == [[]]
            assert list(client.run(_worker_env).values())[0][0] != os.getpid()
    finally:
        gpu_cluster.close()
        one_gpu.close()
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


def _profiles(dask_worker) -> bool:  # noqa: ANN001 - dask passes its worker by this name
    return "profile" in dask_worker.periodic_callbacks


def test_workers_do_not_sample_their_threads_stacks_for_a_dashboard_nobody_serves() -> None:
    # dask's profiler takes the GIL every 10 ms in each worker; the command's cluster serves no dashboard
    for gpus in ([], ["3"]):  # worker processes, and one GPU's worker in this process
        cluster, _ = cl._make(1, gpus)
        try:
            with distributed.Client(cluster) as client:
                assert list(client.run(_profiles).values()) == [False]
        finally:
            cluster.close()
    import dask

    assert dask.config.get("distributed.worker.profile.enabled") is True  # the caller's own setting is left


def _main_module(monkeypatch, tmp_path, text: str) -> str:  # noqa: ANN001
    """A ``__main__`` of a script holding ``text``, as a user's script that calls tsconv.process is."""
    import types

    script = tmp_path / "job.py"
    script.write_text(text)
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    return str(script)


def _nanny_fails(workers, gpus):  # noqa: ANN001, ANN202
    raise RuntimeError("Nanny failed to start.")


def test_a_cluster_that_does_not_start_from_an_unguarded_script_names_the_script_and_the_guard(
    monkeypatch, tmp_path
) -> None:  # fmt: skip
    # dask's own "RuntimeError: Nanny failed to start." was a traceback, naming no cause: the workers had run the
    # script's top-level tsconv.process(workers=...) again as they started
    script = _main_module(monkeypatch, tmp_path, "import tsconv\ntsconv.process('in.zarr', workers=2)\n")
    monkeypatch.setattr(cl, "_make_cluster", _nanny_fails)
    with pytest.raises(TsconvError, match="did not start") as err:
        cl._make(2, [])
    assert repr(script) in str(err.value) and 'if __name__ == "__main__":' in err.value.hint


def test_a_cluster_that_does_not_start_from_a_guarded_script_is_one_error_without_the_guards_advice(
    monkeypatch, tmp_path
) -> None:  # fmt: skip
    _main_module(
        monkeypatch, tmp_path, "import tsconv\nif __name__ == '__main__':\n    tsconv.process('in.zarr')\n"
    )
    monkeypatch.setattr(cl, "_make_cluster", _nanny_fails)
    with pytest.raises(
        TsconvError, match=r"worker processes did not start \(Nanny failed to start.\)"
    ) as err:
        cl._make(2, [])
    assert "__main__" not in str(err.value) and "--scheduler" in err.value.hint


def test_workers_asked_in_a_worker_process_running_the_script_again_are_refused(monkeypatch) -> None:
    # the spawned worker process re-running an unguarded script: it was refused as a second writer of the output
    # ("being written by another tsconv run", the caller's pid), a traceback in each worker's stderr
    import multiprocessing

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(TsconvError, match=r"workers=2 asked in a worker process") as err:
        cl.check_workers(2)
    assert 'if __name__ == "__main__":' in err.value.hint


@pytest.mark.slow  # worker processes importing torch: about 10 s on 2 cores
def test_an_unguarded_script_with_workers_ends_in_the_guards_advice(tmp_path) -> None:
    import subprocess

    import numpy as np
    import zarr

    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w")
    g.create_array("values", data=np.arange(2000, dtype=np.float32).reshape(500, 4))
    (tmp_path / "job.py").write_text("import tsconv\ntsconv.process('in.zarr', 'out.zarr', workers=1)\n")
    res = subprocess.run(
        [sys.executable, "job.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "tsconv.errors.TsconvError: the local dask cluster's 1 worker process did not start"
    )
    assert 'if __name__ == "__main__":' in last and "OutputBusyError" not in res.stderr
