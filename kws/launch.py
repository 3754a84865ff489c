"""How training is launched: torchrun on one node, srun + torchrun on several, GPU budget checks."""

import os
import shlex

from kws.errors import KwsError

RDZV_PORT = 29500


def train_launcher(gpus, processes, nodes=1, lock_dir="results/.gpu-locks"):
    """The command prefix that starts `scripts/train.py` (append the script and its arguments).

    - CPU (gpus == 0): `torchrun --standalone` with `processes` gloo workers.
    - GPUs on one node: the same, wrapped in `python -m kws.gpu`, which takes `gpus` free device ids
      (one lock file per id) and sets CUDA_VISIBLE_DEVICES, because Snakemake counts GPUs but never
      chooses which ones a job gets.
    - Several nodes (SLURM): one torchrun per node through srun, with c10d rendezvous on the first node.
      `--overlap` lets this step share the allocation with the job step the SLURM executor runs us in.
    """
    # Bare `python`/`torchrun`: the workflow puts its own environment first on PATH, and the command
    # (a Snakemake param) then does not change from one machine or environment to another.
    torchrun = "torchrun"
    per_node = gpus if gpus > 0 else processes
    if nodes > 1:
        head = "$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
        return (
            f"srun --overlap --nodes {nodes} --ntasks-per-node 1 {torchrun}"
            f" --nnodes {nodes} --nproc_per_node {per_node} --rdzv_backend c10d"
            f" --rdzv_endpoint {head}:{RDZV_PORT} --rdzv_id \"$SLURM_JOB_ID\""
        )
    standalone = f"{torchrun} --standalone --nnodes 1 --nproc_per_node {per_node}"
    if gpus > 0:
        return f"python -m kws.gpu --gpus {gpus} --lock-dir {shlex.quote(lock_dir)} -- {standalone}"
    return standalone


def check_gpu_budget(requests, budget):
    """Refuse a job that asks for more GPUs than `--resources gpu=N` grants.

    Snakemake silently clamps such a request to the budget, so a 4-GPU training would run on fewer
    GPUs than configured; stop before anything starts instead.
    """
    if budget is None:
        return
    for name, wanted in sorted(requests.items()):
        if wanted > budget:
            raise KwsError(
                f"{name} asks for {wanted} GPU(s) but `--resources gpu={budget}` grants only {budget}; "
                f"raise the budget or lower experiments.{name}.gpus"
                if name != "scoring"
                else f"scoring asks for {wanted} GPU but `--resources gpu={budget}` grants {budget}; set score.gpu: 0"
            )



def slurm_resources(gpus, nodes):
    """SLURM submit settings of a training job (the executor plugin's resource names).

    One node: `gpu` becomes `--gpus`. Several nodes: the same total, spread as `--gpus-per-node` with
    one task per node, since one torchrun per node starts that node's workers.
    """
    extra = f"--ntasks-per-node=1 --gpus-per-node={gpus}" if gpus else "--ntasks-per-node=1"
    return {"gpu": gpus * nodes, "nodes": nodes, "slurm_extra": extra if nodes > 1 else ""}


def import_kws_from(folder):
    """Make the jobs this process starts import the kws package in `folder` (first on PYTHONPATH), so
    that the code a rule declares as its input is the code it runs, whatever is installed."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
