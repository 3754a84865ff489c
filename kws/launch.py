"""How training is launched: torchrun on one node, srun + torchrun on several, SLURM job shapes, GPU budget.

The train rule's command starts with `train_launcher(...)`, a fixed string (a Snakemake param, so it must
not depend on where the job runs); what it does is decided when the job runs:

- one node, CPU: `torchrun --standalone` with `processes` gloo workers;
- one node, GPUs: the same under `python -m kws.gpu`, which takes device ids (lock files, scoped to the
  host or the SLURM job: see kws.gpu.lock_scope) and sets CUDA_VISIBLE_DEVICES;
- several nodes: `python -m kws.launch`, here. It runs inside the SLURM job (on its first node), checks that
  the job got the nodes it asked for, and starts one torchrun per node with `srun`, c10d rendezvous on
  the first node. The executor plugin runs such a job's rule in the batch step, not in a one-task step
  (the `mpi` resource, see slurm_resources), so the srun here is the job's only step and gets the task
  count, CPUs and GPUs it names, whatever SLURM_* variables the plugin left or removed.
"""

import argparse
import os
import shlex
import socket
import subprocess
import sys

from kws.errors import KwsError, cli

RDZV_PORT = 29500
# Memory a training asks SLURM for, per process: a gloo CPU process, or a GPU's process with its loaders.
MEM_MB_PER_CPU_PROCESS = 4000
MEM_MB_PER_GPU = 16000


def torchrun_command(processes, python=None):
    """torchrun on one machine with `processes` workers, as a list: the `torchrun` on PATH, or with `python`
    its `-m torch.distributed.run` (benchmarks and tests run it with their own interpreter)."""
    runner = [python, "-m", "torch.distributed.run"] if python else ["torchrun"]
    return [*runner, "--standalone", "--nnodes", "1", "--nproc_per_node", str(processes)]


def train_launcher(gpus, processes, nodes=1, lock_dir="results/.gpu-locks"):
    """The command prefix that starts `scripts/train.py` (append the script and its arguments)."""
    # Bare `python`/`torchrun`: the workflow puts its own environment first on PATH, and the command
    # (a Snakemake param) then does not change from one machine or environment to another.
    per_node = gpus if gpus > 0 else processes
    if nodes > 1:
        return f"python -m kws.launch --nodes {nodes} --nproc_per_node {per_node} --gpus {gpus} --"
    standalone = " ".join(torchrun_command(per_node))
    if gpus > 0:
        return f"{gpu_launcher(gpus, lock_dir)} {standalone}"
    return standalone


def gpu_launcher(gpus, lock_dir="results/.gpu-locks"):
    """The prefix that runs a command on `gpus` locked GPUs of this host (kws.gpu): training's and scoring's,
    so that both take their devices from the same lock folder."""
    return f"python -m kws.gpu --gpus {gpus} --lock-dir {shlex.quote(lock_dir)} --"


def gpus_argument(gpus):
    """train.py's `--gpus` for `gpus` GPUs per node: ids of the visible devices (kws.gpu or SLURM set
    CUDA_VISIBLE_DEVICES), or -1 for CPU. Always given, so that a GPU training CUDA cannot use stops
    (kws.preflight) instead of training on the CPU, and a CPU training never takes a GPU."""
    return "--gpus " + (",".join(str(i) for i in range(gpus)) if gpus > 0 else "-1")


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


def train_mem_mb(gpus, processes):
    """Memory per node of a training job."""
    return MEM_MB_PER_GPU * gpus if gpus > 0 else MEM_MB_PER_CPU_PROCESS * max(1, processes)


def slurm_resources(gpus, nodes):
    """The train rule's resources that shape its SLURM job (snakemake-executor-plugin-slurm's names);
    None leaves a resource unset. `gpus` is per node.

    - One node: `gpu` (also the local `--resources gpu=N` budget) becomes `--gpus=N`.
    - Several nodes: `mpi` makes the plugin run the rule in the batch step instead of inside
      `srun -n1` (whose one task would be the only one srun could start); `tasks` (> 1, as the plugin
      requires for mpi) gives `--ntasks=<nodes>`, one torchrun per node, instead of the `--ntasks=1` it
      adds otherwise; GPUs go as `--gres=gpu:N`, which SLURM counts per node (the `gpu` resource would
      add `--gpus=<total>`, which the plugin then also asks of every step); `tasks_per_gpu: 0` keeps the
      plugin from turning `tasks` into `--ntasks-per-gpu`.
    """
    if nodes <= 1:
        return {
            "gpu": gpus,
            "nodes": 1,
            "mpi": None,
            "tasks": None,
            "tasks_per_gpu": None,
            "gres": None,
            "slurm_extra": None,
        }
    return {
        "gpu": None,
        "nodes": nodes,
        "mpi": "srun",
        "tasks": nodes,
        "tasks_per_gpu": 0 if gpus else None,
        "gres": f"gpu:{gpus}" if gpus else None,
        "slurm_extra": "--ntasks-per-node=1",
    }


def import_kws_from(folder):
    """Make the jobs this process starts import the kws package in `folder` (first on PYTHONPATH), so
    that the code a rule declares as its input is the code it runs, whatever is installed."""
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


# --------------------------------------------------------------------------- inside a multi-node job


def slurm_job(job_id):
    """The allocation of SLURM job `job_id`: {"nodes": [host names], "cpus": total CPUs}.

    Read from the controller: the executor plugin removes SLURM_JOB_NODELIST and the like from the
    rule's environment."""

    def query(*command):
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise KwsError(f"{command[0]}: cannot ask SLURM about job {job_id} ({err})") from None
        if result.returncode != 0:
            raise KwsError(f"{' '.join(command)}: {result.stderr.strip() or 'failed'}")
        return result.stdout

    fields = dict(part.split("=", 1) for part in query("scontrol", "show", "job", "-o", job_id).split() if "=" in part)
    nodes = query("scontrol", "show", "hostnames", fields.get("NodeList", "")).split()
    return {"nodes": nodes, "cpus": int(fields.get("NumCPUs", "0") or 0)}


def multinode_command(nodes, nproc_per_node, gpus, hosts, cpus, job_id, port):
    """srun starting one torchrun per node of the allocation, rendezvous (c10d) on the first node."""
    srun = [
        "srun",
        "--nodes",
        str(nodes),
        "--ntasks",
        str(nodes),
        "--ntasks-per-node",
        "1",
        "--cpus-per-task",
        str(max(1, cpus // nodes)),
        "--kill-on-bad-exit=1",
    ]
    if gpus > 0:
        srun.append(f"--gres=gpu:{gpus}")
    return srun + [
        "torchrun",
        "--nnodes",
        str(nodes),
        "--nproc_per_node",
        str(nproc_per_node),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"{hosts[0]}:{port}",
        "--rdzv_id",
        str(job_id),
    ]


def _rendezvous_port(head):
    """A free port when the rendezvous host is this one (the batch step runs on the job's first node)."""
    if socket.gethostname().split(".")[0] != head.split(".")[0]:
        return RDZV_PORT
    from kws.preflight import ephemeral_port

    return ephemeral_port()


def launch_multinode(nodes, nproc_per_node, gpus, command, environ=None, job=None):
    """The srun + torchrun command for `command` (train.py and its arguments), after checking the job."""
    environ = os.environ if environ is None else environ
    job_id = environ.get("SLURM_JOB_ID")
    if not job_id:
        raise KwsError(
            f"a training on {nodes} nodes runs as a SLURM job, and this is none (no SLURM_JOB_ID): "
            f"run through the SLURM profile (--workflow-profile workflow/profiles/slurm) or set nodes: 1"
        )
    job = job or slurm_job(job_id)
    if len(job["nodes"]) != nodes:
        raise KwsError(
            f"the training asks for {nodes} nodes but SLURM job {job_id} has {len(job['nodes'])} "
            f"({','.join(job['nodes']) or 'none'}): torchrun would wait for the missing ones forever"
        )
    head = job["nodes"][0]
    return multinode_command(
        nodes, nproc_per_node, gpus, job["nodes"], job["cpus"], job_id, _rendezvous_port(head)
    ) + list(command)


@cli
def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m kws.launch",
        description=__doc__.split("\n\n")[0],
        usage="python -m kws.launch --nodes N --nproc_per_node P [--gpus G] -- train.py ...",
    )
    p.add_argument("--nodes", type=int, required=True, help="nodes of the SLURM job (one torchrun each)")
    p.add_argument("--nproc_per_node", type=int, required=True, help="training processes per node")
    p.add_argument("--gpus", type=int, default=0, help="GPUs per node (0: gloo CPU processes)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the training script and its arguments")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise KwsError("no training command: python -m kws.launch [options] -- scripts/train.py ...")
    full = launch_multinode(args.nodes, args.nproc_per_node, args.gpus, command)
    world = args.nodes * args.nproc_per_node
    print(
        f"kws.launch: SLURM job {os.environ['SLURM_JOB_ID']}: {args.nodes} nodes x {args.nproc_per_node} "
        f"processes = world size {world}: {shlex.join(full)}",
        file=sys.stderr,
        flush=True,
    )
    try:
        os.execvp(full[0], full)
    except OSError as err:
        raise KwsError(f"{full[0]}: cannot run ({err.strerror})") from None


if __name__ == "__main__":
    sys.exit(main())
