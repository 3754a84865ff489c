"""Run the Snakemake workflow from tests: a private copy of the workflow in a temporary folder."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

# The tiny pipeline (seconds of synthetic audio, a 2-layer model, 2 epochs, 2 gloo processes): the config
# that `snakemake --directory .test` runs, one source for both.
TEST_CONFIG = REPO / ".test" / "config" / "config.yaml"
TINY_CONFIG = yaml.safe_load(TEST_CONFIG.read_text())


def copy_checkout(root, extra=()):
    """Copy the workflow, scripts, configs and library (and the `extra` folders) into `root`; returns root."""
    root = Path(root)
    for name in ("workflow", "scripts", "config", "kws", *extra):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "environment.yml", root / "environment.yml")
    return root


def make_workdir(root, config=None):
    """Copy the workflow, scripts, configs and library into `root` and write its config.yaml.

    A copy lets a test edit a script (to check code-change reruns) without touching the checkout.
    """
    root = copy_checkout(root)
    write_config(root, config or TINY_CONFIG)
    return root


def write_config(root, config):
    path = Path(root) / "config" / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake(root, *args, timeout=900):
    """Run snakemake in `root` with this interpreter's environment; return the CompletedProcess."""
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(Path(root) / "workflow" / "Snakefile"),
        "--directory",
        str(root),
        "--cores",
        "2",
        *args,
    ]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=timeout)


def planned_jobs(result):
    """The rules a dry run would execute, as {rule: count}; {} when there is nothing to be done."""
    text = result.stdout + result.stderr
    if "Nothing to be done" in text:
        return {}
    match = re.search(r"Job stats:\n(.*?)\n\s*total\s+\d+", text, re.S)
    assert match, f"no job table in snakemake output:\n{text[-3000:]}"
    jobs = {}
    for line in match.group(1).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            jobs[parts[0]] = int(parts[1])
    return jobs
