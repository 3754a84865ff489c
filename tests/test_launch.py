"""How training is launched: torchrun command lines, GPU locks, SLURM multi-node, the GPU budget."""

import shlex
from types import SimpleNamespace

import pytest

from kws.errors import KwsError
from kws.launch import check_gpu_budget, slurm_resources, train_launcher


def test_cpu_training_is_standalone_torchrun_with_gloo_processes():
    assert train_launcher(gpus=0, processes=3) == "torchrun --standalone --nnodes 1 --nproc_per_node 3"


def test_gpu_training_takes_device_locks_then_one_process_per_gpu():
    words = shlex.split(train_launcher(gpus=2, processes=7, lock_dir="res/.gpu-locks"))
    assert words[:7] == ["python", "-m", "kws.gpu", "--gpus", "2", "--lock-dir", "res/.gpu-locks"]
    assert words[7] == "--"
    assert words[8:] == ["torchrun", "--standalone", "--nnodes", "1", "--nproc_per_node", "2"]


def test_multinode_training_is_one_torchrun_per_node_through_srun_with_c10d():
    command = train_launcher(gpus=4, processes=1, nodes=3)
    assert command.startswith("srun --overlap --nodes 3 --ntasks-per-node 1 torchrun ")
    for part in ("--nnodes 3", "--nproc_per_node 4", "--rdzv_backend c10d", '--rdzv_id "$SLURM_JOB_ID"'):
        assert part in command
    assert '--rdzv_endpoint $(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):29500' in command
    assert "--standalone" not in command and "kws.gpu" not in command  # SLURM assigns the devices


def test_slurm_resources_spread_gpus_per_node():
    assert slurm_resources(gpus=2, nodes=1) == {"gpu": 2, "nodes": 1, "slurm_extra": ""}
    multi = slurm_resources(gpus=4, nodes=2)
    assert multi["gpu"] == 8 and multi["nodes"] == 2
    assert multi["slurm_extra"] == "--ntasks-per-node=1 --gpus-per-node=4"


def test_slurm_submit_options_for_a_multinode_training_job():
    """The sbatch line the Snakemake SLURM executor builds from the train rule's resources."""
    submit = pytest.importorskip("snakemake_executor_plugin_slurm.submit_string")

    class Resources(dict):
        __getattr__ = dict.__getitem__

    resources = Resources(slurm_resources(gpus=4, nodes=2), runtime=1440, mem_mb=16000, cpus_per_gpu=8)
    job = SimpleNamespace(resources=resources, threads=8, is_group=lambda: False)
    params = dict(run_uuid="id", slurm_logfile="log", comment_str="train", account="-A lab", partition="-p gpu",
                  workdir="/work")
    call = submit.get_submit_command(job, params)
    for option in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4", "--cpus-per-gpu=8", "-t 1440",
                   "-A lab", "-p gpu"):
        assert option in call.split() or option in call, (option, call)
    assert "--ntasks-per-gpu" not in call  # one torchrun per node, not one task per GPU


def test_gpu_budget_refuses_requests_above_it():
    check_gpu_budget({"a": 2, "b": 2, "scoring": 0}, 2)
    check_gpu_budget({"a": 8}, None)  # no budget given: Snakemake does not limit
    with pytest.raises(KwsError, match=r"b asks for 4 GPU\(s\) but `--resources gpu=2` grants only 2"):
        check_gpu_budget({"a": 2, "b": 4}, 2)
    with pytest.raises(KwsError, match="scoring asks for 1 GPU"):
        check_gpu_budget({"scoring": 1}, 0)
