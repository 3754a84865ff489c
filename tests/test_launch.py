"""How training is launched: torchrun command lines, GPU locks, SLURM job shapes and multi-node steps, the GPU
budget. What SLURM and the executor plugin make of these is tested on a real cluster: tests/test_slurm.py."""

import os
import shlex
import subprocess
import sys

import pytest

from kws.errors import KwsError
from kws.launch import check_gpu_budget, gpu_launcher, gpus_argument, launch_multinode, slurm_resources, train_launcher


def test_cpu_training_is_standalone_torchrun_with_gloo_processes():
    assert train_launcher(gpus=0, processes=3) == "torchrun --standalone --nnodes 1 --nproc_per_node 3"


def test_gpu_training_takes_device_locks_then_one_process_per_gpu():
    words = shlex.split(train_launcher(gpus=2, processes=7, lock_dir="res/.gpu-locks"))
    assert words[:7] == ["python", "-m", "kws.gpu", "--gpus", "2", "--lock-dir", "res/.gpu-locks"]
    assert words[7] == "--"
    assert words[8:] == ["torchrun", "--standalone", "--nnodes", "1", "--nproc_per_node", "2"]
    # scoring's prefix (the score rule's launcher): the same locks
    assert shlex.split(gpu_launcher(1, "res/.gpu-locks")) == words[:4] + ["1"] + words[5:8]


def test_multinode_training_is_launched_inside_the_slurm_job():
    """The command is fixed (a Snakemake param); kws.launch decides the srun line inside the job."""
    words = shlex.split(train_launcher(gpus=4, processes=1, nodes=3))
    assert words == ["python", "-m", "kws.launch", "--nodes", "3", "--nproc_per_node", "4", "--gpus", "4", "--"]
    assert shlex.split(train_launcher(gpus=0, processes=2, nodes=2))[5:7] == ["--nproc_per_node", "2"]


def test_multinode_job_starts_one_torchrun_per_node_with_c10d_on_the_first():
    job = {"nodes": ["n07", "n08"], "cpus": 32}
    words = launch_multinode(2, 4, 4, ["scripts/train.py", "--x"], environ={"SLURM_JOB_ID": "77"}, job=job)
    srun, torchrun = words[: words.index("torchrun")], words[words.index("torchrun") :]
    assert srun[:7] == ["srun", "--nodes", "2", "--ntasks", "2", "--ntasks-per-node", "1"]
    assert "--cpus-per-task" in srun and srun[srun.index("--cpus-per-task") + 1] == "16"  # the job's CPUs per node
    assert "--gres=gpu:4" in srun  # every node's GPUs, in the step itself
    assert torchrun[:5] == ["torchrun", "--nnodes", "2", "--nproc_per_node", "4"]
    assert torchrun[torchrun.index("--rdzv_backend") + 1] == "c10d"
    assert torchrun[torchrun.index("--rdzv_endpoint") + 1].startswith("n07:")
    assert torchrun[torchrun.index("--rdzv_id") + 1] == "77"
    assert words[-2:] == ["scripts/train.py", "--x"]
    cpu = launch_multinode(2, 2, 0, ["t.py"], environ={"SLURM_JOB_ID": "5"}, job=job)
    assert not any(w.startswith("--gres") for w in cpu)


def test_multinode_job_with_fewer_nodes_stops_naming_both_numbers():
    with pytest.raises(KwsError, match=r"asks for 2 nodes but SLURM job 9 has 1 \(n1\)"):
        launch_multinode(2, 2, 0, ["t.py"], environ={"SLURM_JOB_ID": "9"}, job={"nodes": ["n1"], "cpus": 2})


def test_multinode_training_outside_slurm_stops_with_what_to_do():
    result = subprocess.run(
        [sys.executable, "-m", "kws.launch", "--nodes", "2", "--nproc_per_node", "2", "--", "scripts/train.py"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: a training on 2 nodes runs as a SLURM job")
    assert "--workflow-profile workflow/profiles/slurm" in result.stderr


def test_slurm_job_shapes():
    assert slurm_resources(gpus=2, nodes=1) == {
        "gpu": 2,
        "nodes": 1,
        "mpi": None,
        "tasks": None,
        "tasks_per_gpu": None,
        "gres": None,
        "slurm_extra": None,
    }
    multi = slurm_resources(gpus=4, nodes=2)
    # Run the rule in the batch step (mpi), one task per node, GPUs counted per node.
    assert multi == {
        "gpu": None,
        "nodes": 2,
        "mpi": "srun",
        "tasks": 2,
        "tasks_per_gpu": 0,
        "gres": "gpu:4",
        "slurm_extra": "--ntasks-per-node=1",
    }
    assert slurm_resources(gpus=0, nodes=2)["gres"] is None


def test_train_script_always_gets_its_gpus():
    assert gpus_argument(0) == "--gpus -1"
    assert gpus_argument(2) == "--gpus 0,1"


def test_gpu_budget_refuses_requests_above_it():
    check_gpu_budget({"a": 2, "b": 2, "scoring": 0}, 2)
    check_gpu_budget({"a": 8}, None)  # no budget given: Snakemake does not limit
    with pytest.raises(KwsError, match=r"b asks for 4 GPU\(s\) but `--resources gpu=2` grants only 2"):
        check_gpu_budget({"a": 2, "b": 4}, 2)
    with pytest.raises(KwsError, match="scoring asks for 1 GPU"):
        check_gpu_budget({"scoring": 1}, 0)
