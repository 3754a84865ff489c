"""The GPU allocator (lock file per id) and free-port finder, with faked GPU ids (no GPU needed)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kws import gpu
from kws.errors import KwsError

REPO = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def holder(lock_dir, count, visible, seconds=60, out=None):
    """`python -m kws.gpu` holding `count` of `visible` while a child sleeps; prints CUDA_VISIBLE_DEVICES."""
    child = (
        "import os, sys, time; print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ['KWS_FREE_PORT'], "
        f"flush=True); time.sleep({seconds})"
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kws.gpu",
            "--gpus",
            str(count),
            "--visible",
            visible,
            "--lock-dir",
            str(lock_dir),
            "--poll",
            "0.05",
            "--",
            sys.executable,
            "-c",
            child,
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_concurrent_allocations_are_disjoint(tmp_path):
    first = gpu.try_acquire(2, visible="0,1,2,3", lock_dir=tmp_path)
    second = gpu.try_acquire(2, visible="0,1,2,3", lock_dir=tmp_path)
    assert first is not None and second is not None
    assert not set(first.ids) & set(second.ids) and len(set(first.ids + second.ids)) == 4
    assert gpu.try_acquire(1, visible="0,1,2,3", lock_dir=tmp_path) is None
    second.release()
    with gpu.acquire(2, visible="0,1,2,3", lock_dir=tmp_path, timeout=0) as third:
        assert set(third.ids) == set(second.ids)
        assert third.cuda_visible_devices == ",".join(third.ids)
    first.release()


def test_wrapper_sets_devices_and_a_killed_holder_releases(tmp_path):
    proc = holder(tmp_path, 2, "0,1,2")
    try:
        ids, port = proc.stdout.readline().split()
        assert len(ids.split(",")) == 2 and set(ids.split(",")) <= {"0", "1", "2"}
        assert 1024 <= int(port) < 65536
        assert gpu.try_acquire(2, visible="0,1,2", lock_dir=tmp_path) is None  # held by the child
        rest = gpu.try_acquire(1, visible="0,1,2", lock_dir=tmp_path)
        assert rest is not None and rest.ids[0] not in ids.split(",")
        rest.release()
    finally:
        proc.send_signal(signal.SIGKILL)  # the wrapper exec'd the child: this kills the holder
        proc.wait()
    with gpu.acquire(3, visible="0,1,2", lock_dir=tmp_path, timeout=10, poll=0.05) as all_three:
        assert sorted(all_three.ids) == ["0", "1", "2"]


def test_waits_until_free_or_times_out(tmp_path):
    proc = holder(tmp_path, 1, "0,1", seconds=1.0)
    try:
        assert proc.stdout.readline().strip()
        with pytest.raises(KwsError, match="no 2 free GPU"):
            gpu.acquire(2, visible="0,1", lock_dir=tmp_path, timeout=0.2, poll=0.05)
        started = time.monotonic()
        with gpu.acquire(2, visible="0,1", lock_dir=tmp_path, timeout=60, poll=0.05) as both:
            assert sorted(both.ids) == ["0", "1"]
        assert time.monotonic() - started > 0.2  # it had to wait for the holder to exit
    finally:
        proc.kill()
        proc.wait()


def test_more_than_visible_is_an_error(tmp_path):
    with pytest.raises(KwsError, match="asked for 3 GPU.*only 2 visible"):
        gpu.acquire(3, visible="0,1", lock_dir=tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "kws.gpu", "--gpus", "3", "--visible", "0,1", "--lock-dir", str(tmp_path), "--", "true"],
        env=ENV,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and result.stderr.startswith("error: asked for 3 GPU")


def test_visible_set_sources(monkeypatch):
    monkeypatch.delenv("KWS_VISIBLE_GPUS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert gpu.visible_gpus() == ["2", "5"]
    monkeypatch.setenv("KWS_VISIBLE_GPUS", "0,1,2,3")
    assert gpu.visible_gpus() == ["0", "1", "2", "3"]
    assert gpu.visible_gpus("7") == ["7"]
    assert gpu.visible_gpus("-1") == []


def test_wrapper_exit_status_port_placeholder_and_no_gpus(tmp_path):
    code = (
        "import os, sys; print(sys.argv[1], os.environ['KWS_FREE_PORT'], os.environ.get('CUDA_VISIBLE_DEVICES'));"
        " sys.exit(3)"
    )
    env = dict(ENV)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kws.gpu",
            "--gpus",
            "0",
            "--lock-dir",
            str(tmp_path),
            "--",
            sys.executable,
            "-c",
            code,
            "--master_port={free_port}",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 3
    arg, port, devices = result.stdout.split()
    assert arg == f"--master_port={port}" and devices == "None"


def test_free_ports_differ_and_are_bindable(tmp_path):
    port_a, fd_a = gpu.free_port(tmp_path)
    port_b, fd_b = gpu.free_port(tmp_path)
    try:
        assert port_a != port_b
        for port in (port_a, port_b):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))
    finally:
        os.close(fd_a)
        os.close(fd_b)


def test_jobs_of_different_slurm_allocations_do_not_wait_for_each_other(tmp_path, monkeypatch):
    """SLURM numbers each job's GPUs from 0 on every node: a lock dir on the shared filesystem must not make
    job B (another allocation, maybe another node) wait for job A's "GPU 0". Jobs that share one allocation
    (a local Snakemake inside salloc) still compete for its devices."""
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    first = gpu.try_acquire(1, visible="0", lock_dir=tmp_path)
    same_job = gpu.try_acquire(1, visible="0", lock_dir=tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "102")
    other_job = gpu.try_acquire(1, visible="0", lock_dir=tmp_path)
    try:
        assert first is not None and same_job is None
        assert other_job is not None and other_job.ids == ["0"]
    finally:
        first.release()
        other_job.release()
    monkeypatch.delenv("SLURM_JOB_ID")
    with gpu.acquire(1, visible="0", lock_dir=tmp_path, timeout=0) as outside:
        assert outside.ids == ["0"]
    assert gpu.lock_scope({"SLURM_JOB_ID": "7"}).endswith("-slurm7")
    assert gpu.lock_scope({}) == socket.gethostname().split(".")[0]
