"""bench/run.py's wait for free GPUs when the bench is pinned by CUDA_VISIBLE_DEVICES: one-GPU benches
run side by side on a 2-GPU host (CUDA_VISIBLE_DEVICES=0 and =1), and the run on GPU 1 was skipped
for GPU 0's process. Pinned, only processes on the bench's own GPUs (nvidia-smi indices, matched by
PCI bus id) hold a run back; the others are recorded as neighbours. Unpinned, any process on any GPU
still does (a stray rank of a timed-out run made a 2-GPU row read 46% weak scaling)."""

from __future__ import annotations

import pytest
from test_run_dry import _bench, _busy_runner

# --query-compute-apps: $FAKE_APPS (pid, used_memory, gpu_bus_id; the first two where only they are
# asked for); --query-gpu: $FAKE_GPUS, or a failure where FAKE_GPUS_FAIL is set
FAKE_NVIDIA_SMI = r"""#!/bin/sh
case "$*" in
  *query-compute-apps=pid,used_memory,gpu_bus_id*) [ -f "$FAKE_APPS" ] && cat "$FAKE_APPS";;
  *query-compute-apps=pid,used_memory\ *) [ -f "$FAKE_APPS" ] && cut -d, -f1,2 "$FAKE_APPS";;
  *query-gpu=index,pci.bus_id*) [ -n "$FAKE_GPUS_FAIL" ] && exit 9; cat "$FAKE_GPUS";;
esac
exit 0
"""

GPUS = "0, 00000000:18:00.0\n1, 00000000:2A:00.0\n"  # nvidia-smi --query-gpu=index,pci.bus_id on two GPUs
ON_GPU0 = "4242, 8800 MiB, 00000000:18:00.0\n"
ON_GPU1 = "4243, 1200 MiB, 00000000:2a:00.0\n"  # bus ids compare case-insensitively


@pytest.fixture
def gpu_run(tmp_path, monkeypatch):
    """(bench, runner, run, mark): test_run_dry's GPU Runner (a run that only leaves a mark that it
    started) over a fake two-GPU nvidia-smi whose compute apps are tmp_path/apps."""
    runner, run, mark = _busy_runner(tmp_path, monkeypatch, allow=False)
    (tmp_path / "bin" / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)  # the same file, which knows the bus ids
    (tmp_path / "gpus").write_text(GPUS)
    monkeypatch.setenv("FAKE_GPUS", str(tmp_path / "gpus"))
    monkeypatch.delenv("FAKE_GPUS_FAIL", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return _bench(), runner, run, mark


def test_pinned_to_gpu1_a_process_on_gpu0_is_a_neighbour_not_a_blocker(gpu_run, tmp_path, monkeypatch):
    bench, runner, run, mark = gpu_run
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    (tmp_path / "apps").write_text(ON_GPU0)
    res = runner.execute(run)
    assert mark.exists(), res["status"]
    assert "busy" not in res["status"] and "gpus_busy" not in res
    assert res["gpus_neighbours"] == "pid 4242 (8800 MiB) on GPU 0"
    # results.md: the row's status is untouched; one line under the suite names the neighbour
    run.result = res
    md, data = bench.render({"date": "d", "versions": {}}, {"single": [run]}, bench.Ctx(
        bench.parse_args([]), 1, tmp_path, tmp_path, tmp_path, tmp_path, False, 1.0))  # fmt: skip
    assert "- r: pid 4242 (8800 MiB) on GPU 0" in md.splitlines()
    assert data["suites"]["single"]["runs"][0]["gpus_neighbours"] == "pid 4242 (8800 MiB) on GPU 0"


def test_pinned_to_gpu1_a_process_on_gpu1_blocks(gpu_run, tmp_path, monkeypatch):
    bench, runner, run, mark = gpu_run
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    (tmp_path / "apps").write_text(ON_GPU0 + ON_GPU1)
    res = runner.execute(run)
    assert res["status"] == "SKIPPED (GPUs busy: pid 4243 (1200 MiB))"
    assert res["gpus_neighbours"] == "pid 4242 (8800 MiB) on GPU 0"
    assert not mark.exists(), "the run started beside a process on its own GPU"


@pytest.mark.parametrize("cvd", [None, "0,1", "GPU-5f0c2e1a"])  # unpinned; every GPU named; not an index
def test_unpinned_any_process_on_any_gpu_blocks(gpu_run, tmp_path, monkeypatch, cvd):
    bench, runner, run, mark = gpu_run
    if cvd is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    (tmp_path / "apps").write_text(ON_GPU1)
    res = runner.execute(run)
    assert res["status"] == "SKIPPED (GPUs busy: pid 4243 (1200 MiB))"
    assert "gpus_neighbours" not in res and not mark.exists()


@pytest.mark.parametrize("how", ["unknown bus id", "no bus id", "GPU query fails"])
def test_pinned_a_process_whose_gpu_cannot_be_told_blocks(gpu_run, tmp_path, monkeypatch, how):
    bench, runner, run, mark = gpu_run
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    apps = {"unknown bus id": "4244, 500 MiB, 00000000:99:00.0\n", "no bus id": "4244, 500 MiB\n"}
    (tmp_path / "apps").write_text(apps.get(how, "4244, 500 MiB, 00000000:18:00.0\n"))
    if how == "GPU query fails":
        monkeypatch.setenv("FAKE_GPUS_FAIL", "1")
    res = runner.execute(run)
    assert res["status"] == "SKIPPED (GPUs busy: pid 4244 (500 MiB))"
    assert not mark.exists()


def test_gpu_holders_splits_by_the_pinned_indices(gpu_run, tmp_path):
    bench = gpu_run[0]
    (tmp_path / "apps").write_text(ON_GPU0 + ON_GPU1 + "No running processes found\n")
    assert bench.gpu_holders(["1"]) == (["pid 4243 (1200 MiB)"], ["pid 4242 (8800 MiB) on GPU 0"])
    assert bench.gpu_holders(["0"]) == (["pid 4242 (8800 MiB)"], ["pid 4243 (1200 MiB) on GPU 1"])
    assert bench.gpu_holders() == (["pid 4242 (8800 MiB)", "pid 4243 (1200 MiB)"], [])
