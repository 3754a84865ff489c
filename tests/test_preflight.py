"""The multi-GPU preflight checks, with fake GPUs (CudaInfo.fake) and real sockets for the port check."""

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kws.errors import KwsError
from kws.preflight import (
    CudaInfo,
    check_port,
    describe_port_holder,
    find_free_port,
    parse_gpus,
    port_is_free,
    run_preflight,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"dataset_conf": {}, "model": {}, "training_config": {"grad_clip": 5, "max_epoch": 1}}
NO_CLIP = {"dataset_conf": {}, "model": {}, "training_config": {"max_epoch": 1}}


def ns(**kwargs):
    base = dict(
        gpus=None,
        nproc_per_node=None,
        config=CONFIG,
        num_workers=1,
        master_port=None,
        dist_backend="auto",
        threads=None,
    )
    base.update(kwargs)
    return argparse.Namespace(**base)


def preflight(args, cuda=None, environ=None, cpus=64, **kwargs):
    return run_preflight(
        args,
        environ={} if environ is None else environ,
        cuda=CudaInfo.fake(4) if cuda is None else cuda,
        cpus=cpus,
        **kwargs,
    )


def test_two_gpus_pass_with_nccl_and_report_free_memory():
    cuda = CudaInfo.fake(4, free_gib=[70, 80, 80, 80], total_gib=80)
    report = preflight(ns(gpus="0,1", nproc_per_node=2), cuda=cuda)
    assert list(report) == []
    assert report.backend == "nccl" and report.gpus == [0, 1] and report.nproc_per_node == 2
    assert any("GPU 0" in line and "70.0 GiB free of 80.0 GiB" in line for line in report.ok)


def test_gpus_must_match_nproc_per_node():
    with pytest.raises(KwsError, match=r"--gpus 0,1 lists 2 GPU\(s\) but --nproc_per_node is 4"):
        preflight(ns(gpus="0,1", nproc_per_node=4))


def test_gpus_must_match_local_world_size_under_torchrun():
    env = {"LOCAL_WORLD_SIZE": "3", "WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0"}
    with pytest.raises(KwsError, match="LOCAL_WORLD_SIZE is 3"):
        preflight(ns(gpus="0,1"), environ=env)
    with pytest.raises(KwsError, match="--nproc_per_node 2 but torchrun started LOCAL_WORLD_SIZE=3"):
        preflight(ns(gpus="0,1", nproc_per_node=2), environ=env)


@pytest.mark.parametrize(
    "gpus, message",
    [
        ("0,1,0", "GPU 0 is listed twice"),
        ("0,-2", "must be >= 0"),
        ("0,a", "'a' is not a GPU id"),
    ],
)
def test_bad_gpu_ids(gpus, message):
    with pytest.raises(KwsError, match=message):
        preflight(ns(gpus=gpus, nproc_per_node=len(gpus.split(","))))


def test_cpu_gpus_spelling():
    assert parse_gpus("-1") == [] and parse_gpus("") == [] and parse_gpus(None) == [] and parse_gpus("1, 0") == [1, 0]


def test_invisible_gpu_respects_cuda_visible_devices():
    # 8 physical GPUs, the job sees two of them: --gpus ids index the visible ones.
    cuda = CudaInfo.fake(8, cuda_visible_devices="4,5")
    env = {"CUDA_VISIBLE_DEVICES": "4,5"}
    report = preflight(ns(gpus="0,1", nproc_per_node=2), cuda=cuda, environ=env)
    assert any("cuda:1 = physical 5" in line for line in report.ok)
    with pytest.raises(KwsError, match=r"GPU 2 but CUDA sees only 2 device\(s\).*CUDA_VISIBLE_DEVICES=4,5"):
        preflight(ns(gpus="0,2", nproc_per_node=2), cuda=cuda, environ=env)
    # WeKws style: physical ids that CUDA_VISIBLE_DEVICES lists are accepted too.
    report = preflight(ns(gpus="5", nproc_per_node=1), cuda=cuda, environ=env)
    assert any(line.startswith("GPU 5 (cuda:1 = physical 5)") for line in report.ok)
    with pytest.raises(KwsError, match="GPU 4 but CUDA sees only 2"):
        preflight(ns(gpus="4,6", nproc_per_node=2), cuda=cuda, environ=env)


def test_no_gpu_at_all():
    with pytest.raises(KwsError, match="CUDA sees no GPU.*--gpus -1"):
        preflight(ns(gpus="0", nproc_per_node=1), cuda=CudaInfo.fake(0))


def test_busy_gpu_is_a_warning():
    cuda = CudaInfo.fake(2, free_gib=[2, 80], total_gib=80)
    report = preflight(ns(gpus="0,1", nproc_per_node=2), cuda=cuda)
    assert any("GPU 0" in w and "another job" in w for w in report)


def test_backend_resolution_and_nccl_errors():
    assert preflight(ns(gpus="-1", nproc_per_node=2), cuda=CudaInfo.fake(0)).backend == "gloo"
    assert preflight(ns(gpus="0", nproc_per_node=1)).backend == "nccl"
    with pytest.raises(KwsError, match="nccl needs GPUs but CUDA sees none"):
        preflight(ns(nproc_per_node=2, dist_backend="nccl"), cuda=CudaInfo.fake(0))
    with pytest.raises(KwsError, match="no NCCL"):
        preflight(ns(gpus="0,1", nproc_per_node=2, dist_backend="nccl"), cuda=CudaInfo.fake(2, nccl_available=False))
    with pytest.raises(KwsError, match="needs NCCL"):
        preflight(ns(gpus="0,1", nproc_per_node=2), cuda=CudaInfo.fake(2, nccl_available=False))
    with pytest.raises(KwsError, match="unknown backend"):
        preflight(ns(dist_backend="mpi"))
    report = preflight(ns(gpus="0,1", nproc_per_node=2, dist_backend="gloo"))
    assert report.backend == "gloo" and any("slower than nccl" in w for w in report)
    # WeKws spelling of the option as a dict key
    assert preflight({"gpus": "0", "nproc_per_node": 1, "ddp.dist_backend": "gloo"}).backend == "gloo"


def test_missing_grad_clip_warns_with_default(tmp_path):
    report = preflight(ns(config=NO_CLIP))
    assert any("training_config.grad_clip is not set" in w and "default 50" in w for w in report)
    path = tmp_path / "m.yaml"
    path.write_text("dataset_conf: {}\nmodel: {}\ntraining_config: {max_epoch: 1}\n")
    report = preflight(ns(config=str(path)))
    assert any(w.startswith(f"{path}: training_config.grad_clip") for w in report)
    with pytest.raises(KwsError, match="grad_clip must be a positive number"):
        preflight(ns(config={**CONFIG, "training_config": {"grad_clip": 0}}))
    assert not preflight(ns(config=str(ROOT / "config/models/ds_tcn.yaml")))


def test_num_workers():
    report = preflight(ns(gpus="0,1", nproc_per_node=2, num_workers=8), cpus=8)
    assert any("needs 18 CPUs" in w and "--num_workers 3" in w for w in report)
    assert not preflight(ns(gpus="0,1", nproc_per_node=2, num_workers=3), cpus=8)
    assert any(
        "needs 18 CPUs" in w for w in preflight(ns(gpus="0,1", nproc_per_node=2, num_workers=8, threads=8), cpus=None)
    )
    with pytest.raises(KwsError, match="--num_workers -1: must be >= 0"):
        preflight(ns(num_workers=-1))


@pytest.fixture
def listener():
    """A socket listening on a free port, held by this test process."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


def test_port_in_use_names_the_holder(listener):
    port = listener
    assert not port_is_free(port)
    assert f"pid {os.getpid()}" in describe_port_holder(port)
    held = rf"port {port} is already in use \(held by pid {os.getpid()} .*--master_port \d+"
    with pytest.raises(KwsError, match=held):
        preflight(ns(master_port=port))
    chosen, warning = check_port(port, choose=True)
    assert chosen != port and port_is_free(chosen) and f"using --master_port {chosen}" in warning
    report = preflight(ns(master_port=port), choose_port=True)
    assert report.master_port != port and len(report) == 1
    # Inside torchrun the agent holds the port: not checked.
    assert not preflight(ns(master_port=port), environ={"TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": "1"})


def test_free_port_passes():
    port = find_free_port(40000)
    report = preflight(ns(master_port=port))
    assert report.master_port == port and any(f"port {port}: free" in line for line in report.ok)


def test_script_ok_and_error(tmp_path, listener):
    cmd = [
        sys.executable,
        str(ROOT / "scripts/preflight.py"),
        "--gpus",
        "-1",
        "--nproc_per_node",
        "2",
        "--config",
        str(ROOT / "config/models/ds_tcn.yaml"),
        "--num_workers",
        "0",
        "--threads",
        "4",
        "--master_port",
        str(find_free_port(41000)),
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ok: backend: gloo" in out.stdout and "preflight passed" in out.stdout
    cmd[cmd.index("--master_port") + 1] = str(listener)
    out = subprocess.run(
        cmd + ["--override", "training_config.grad_clip=null"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stderr.startswith("error: rendezvous port") and f"pid {os.getpid()}" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
