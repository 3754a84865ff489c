"""The SLURM profile on a real SLURM cluster (tests/slurm/cluster.py: slurm-wlm from Debian, two emulated
nodes, no accounting): what a cluster user gets from `snakemake --workflow-profile workflow/profiles/slurm`.

Needs Linux and root; installs slurm-wlm and munge when they are missing. Without them the tests skip,
except where KWS_REQUIRE_SLURM is set (.ci/run): there a cluster that cannot start is a failure.
"""

import copy
import os
import re
import subprocess
import sys

import pytest
from slurm import cluster as cluster_module
from slurm.cluster import Cluster, ClusterUnavailable

from workflow_utils import TINY_CONFIG, make_workdir, write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        cluster = Cluster(tmp_path_factory.mktemp("slurm"))
        cluster.start()
    except ClusterUnavailable as err:
        if os.environ.get("KWS_REQUIRE_SLURM"):
            pytest.fail(f"the SLURM cluster test could not run: {err}")
        pytest.skip(f"no SLURM test cluster here: {err}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("project"))


def experiments(**shapes):
    """TINY_CONFIG with one tiny experiment per name, each with the given gpus/nodes."""
    config = copy.deepcopy(TINY_CONFIG)
    tiny = config["experiments"]["tiny"]
    config["experiments"] = {name: dict(tiny, **shape) for name, shape in shapes.items()}
    return config


def profile_run(cluster, root, *args, timeout=400):
    """The README's cluster command (smoke run) with the partition from the environment."""
    env = dict(cluster.env, KWS_SLURM_PARTITION=cluster.partition)
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--workflow-profile",
        "workflow/profiles/slurm",
        "--config",
        "smoke=True",
        *args,
    ]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    return result, result.stdout + result.stderr


def slurm_jobs(output):
    """{"rule" or "train:<exp>": SLURM job id} of the jobs a run submitted."""
    submitted = dict(re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", output))
    jobs = {}
    for rule, block in re.findall(r"(?m)^rule (\w+):\n((?:    .*\n)+)", output):
        jobid = re.search(r"jobid: (\d+)", block).group(1)
        exp = re.search(r"wildcards: exp=(\w+)", block)
        if jobid in submitted:
            jobs[f"{rule}:{exp.group(1)}" if rule == "train" else rule] = submitted[jobid]
    return jobs


def squeue(cluster, job_id, fields):
    """squeue's `fields` (e.g. "%N %C") of a job; finished jobs stay listed for MinJobAge."""
    return subprocess.run(
        ["squeue", "-h", "--states=all", "-j", job_id, "-o", fields], env=cluster.env, capture_output=True, text=True
    ).stdout.split()


def train_log(root, exp):
    return (root / "results" / "smoke" / "logs" / f"train.{exp}.log").read_text()


def nodes_of(cluster, job_id):
    return subprocess.run(
        ["scontrol", "show", "hostnames", squeue(cluster, job_id, "%N")[0]],
        env=cluster.env,
        capture_output=True,
        text=True,
    ).stdout.split()


@pytest.fixture(scope="module")
def one_node_run(cluster, project):
    """The smoke pipeline from an empty folder with a one-node CPU training."""
    write_config(project, experiments(tiny={"nodes": 1}))
    return profile_run(cluster, project)


@pytest.fixture(scope="module")
def multi_node_and_gpu_run(cluster, project, one_node_run):
    """One run, so that its trainings queue together: the same training on two nodes, and a 1-node and a
    2-node GPU training (which fail: the GPUs are fake)."""
    write_config(project, experiments(tiny={"nodes": 2}, g1={"gpus": 2, "nodes": 1}, g2={"gpus": 2, "nodes": 2}))
    return profile_run(cluster, project, "--keep-going")


def test_one_node_training_through_the_profile(cluster, project, one_node_run):
    result, output = one_node_run
    assert result.returncode == 0, output[-6000:]
    assert (project / "results" / "smoke" / "tiny" / "model" / "final.yaml").exists()
    jobs = slurm_jobs(output)
    # The heavy rules are SLURM jobs, the cheap ones run here (localrules).
    assert set(jobs) == {"synthesize_corpus", "compute_cmvn", "train:tiny"}, jobs
    assert "2 process(es) on cpu (gloo)" in train_log(project, "tiny")
    # Successful jobs' SLURM logs are kept, and a second run has nothing to do.
    assert (project / ".snakemake" / "slurm_logs" / "rule_train" / "tiny" / f"{jobs['train:tiny']}.log").exists()
    again, output = profile_run(cluster, project)
    assert again.returncode == 0 and "Nothing to be done" in output, output[-3000:]


def test_two_node_training_runs_one_torchrun_per_node(cluster, project, multi_node_and_gpu_run):
    result, output = multi_node_and_gpu_run
    assert (project / "results" / "smoke" / "tiny" / "model" / "final.yaml").exists(), output[-6000:]
    log = train_log(project, "tiny")
    assert "2 nodes x 2 processes = world size 4" in log
    assert "4 process(es) on cpu (gloo)" in log  # the trainer's world size: both torchruns joined
    assert "training finished" in log
    assert nodes_of(cluster, slurm_jobs(output)["train:tiny"]) == cluster.node_names
    # kws.supervise kept the log of this attempt and of the one-node training before it.
    assert len(list((project / "results" / "smoke" / "logs" / "attempts").glob("train.tiny.log.*.log"))) == 2


def test_gpu_jobs_are_accepted_by_slurm_and_stop_without_cuda(cluster, project, multi_node_and_gpu_run):
    """The cluster's GPUs are fake (gres files, no CUDA): SLURM must accept the sbatch and srun lines of
    a 1-node and a 2-node GPU training and start them, and the training must stop, not fall back to CPU."""
    result, output = multi_node_and_gpu_run
    assert result.returncode != 0
    assert "sbatch failed" not in output and "Unable to create step" not in output, output[-6000:]
    one, two = train_log(project, "g1"), train_log(project, "g2")
    assert re.search(r"kws\.gpu: CUDA_VISIBLE_DEVICES=\d,\d ", one)  # the 2 SLURM gave, no lock waited for
    assert "--gres=gpu:2 torchrun --nnodes 2 --nproc_per_node 2" in two
    for log, ranks in ((one, 2), (two, 4)):
        # Every rank refuses; torchrun stops a rank's peers at its first failure, so a peer may be stopped
        # (exit -15) before it gets to say so itself.
        refused = log.count("error: --gpus 0,1: CUDA cannot use any device here")
        stopped = log.count("exitcode  : -15")
        assert 1 <= refused <= ranks and refused + stopped >= ranks, log[-3000:]
    assert "host      : kwsn1" in two and "host      : kwsn2" in two  # the step ran on both nodes
    assert not (project / "results" / "smoke" / "g1" / "model" / "final.yaml").exists()
    # Sized per GPU by the profile (cpus_per_gpu: 8) and the rule (16 GB per GPU), per node.
    jobs = slurm_jobs(output)
    assert squeue(cluster, jobs["train:g1"], "%C %m") == ["16", "32000M"]
    assert squeue(cluster, jobs["train:g2"], "%C %m %D") == ["32", "32000M", "2"]


def test_a_job_refused_before_its_rule_starts_shows_no_old_log(cluster, project):
    """A job SLURM refuses never reaches its rule, so nothing there deletes the log: the failure report
    must not print the previous run's training log as this run's."""
    write_config(project, experiments(tiny={"nodes": 1}))
    log = project / "results" / "smoke" / "logs" / "train.tiny.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("the previous run's training log\n")
    result, output = profile_run(
        cluster, project, "--forcerun", "train", "--set-resources", "train:constraint=nosuchfeature"
    )
    assert result.returncode != 0 and "Invalid feature specification" in output, output[-3000:]
    assert "the previous run's training log" not in output and "train.tiny.log not found" in output


def test_missing_packages_and_a_failing_apt_get_give_one_line(tmp_path, monkeypatch):
    """A CI machine without slurm-wlm whose apt-get update fails: one line saying so, not a traceback."""
    fake = tmp_path / "apt-get"
    fake.write_text(
        "#!/bin/sh\necho 'E: Failed to fetch http://deb.debian.org/ Temporary failure resolving' >&2\nexit 100\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(cluster_module, "PACKAGES", {"kws-no-such-command": "slurm-wlm"})
    with pytest.raises(ClusterUnavailable) as err:
        cluster_module.ensure_packages()
    message = str(err.value)
    assert "\n" not in message and "slurm-wlm" in message
    if os.geteuid() == 0:
        assert message == (
            "apt-get update failed, so slurm-wlm cannot be installed: "
            "E: Failed to fetch http://deb.debian.org/ Temporary failure resolving"
        )
    else:
        assert "needs root" in message
