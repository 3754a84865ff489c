"""kws.supervise: nothing a training started outlives the workflow, a dead parent, or the run itself;
every attempt's log is kept."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreaper is Linux only")

# A "training": a child in a session of its own (as torchrun starts its ranks) with a child of its own
# (as a rank starts its forkserver), writing their pids, then waiting forever.
TREE = """
import os, subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import subprocess, time; "
                         "p = subprocess.Popen(['sleep', '600']); open('helper.pid', 'w').write(str(p.pid)); "
                         "time.sleep(600)"], start_new_session=True)
open("rank.pid", "w").write(str(rank.pid))
print("training started", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 600)
sys.exit(3)
"""


def supervise(folder, *args, watch=None, seconds=None):
    (folder / "tree.py").write_text(TREE)
    command = [sys.executable, "-m", "kws.supervise", "--log", "logs/train.log", "--grace", "2"]
    if watch is not None:
        command += ["--watch-pid", str(watch)]
    command += ["--", sys.executable, "tree.py", *([str(seconds)] if seconds else [])]
    return subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_file(path, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no {path.name}"
        time.sleep(0.05)
    return int(path.read_text())


def gone_within(pids, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_the_whole_tree_stops_when_the_workflow_dies(tmp_path):
    workflow = subprocess.Popen(["sleep", "600"])  # stands in for Snakemake
    proc = supervise(tmp_path, watch=workflow.pid)
    rank = wait_for_file(tmp_path / "rank.pid", proc)
    helper = wait_for_file(tmp_path / "helper.pid", proc)
    workflow.kill()
    workflow.wait()
    assert gone_within([proc.pid, rank, helper], 10), "training outlived the killed workflow"
    assert proc.wait(5) == 128 + signal.SIGTERM
    log = (tmp_path / "logs" / "train.log").read_text()
    assert "training started" in log and "died: stopping" in log


def test_an_orphan_is_stopped_while_the_command_runs(tmp_path):
    """A killed rank's children (forkserver, resource tracker) are handed to the supervisor and stopped."""
    proc = supervise(tmp_path)
    rank = wait_for_file(tmp_path / "rank.pid", proc)
    helper = wait_for_file(tmp_path / "helper.pid", proc)
    os.kill(rank, signal.SIGKILL)
    assert gone_within([helper], 5), "the dead rank's child lived on"
    assert proc.poll() is None  # the training itself goes on
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM


def test_exit_status_passes_through_and_every_attempt_log_is_kept(tmp_path):
    for attempt in (1, 2):
        proc = supervise(tmp_path, seconds=0.5)
        assert proc.wait(30) == 3
        if attempt == 1:
            helper = int((tmp_path / "helper.pid").read_text())
            assert gone_within([helper], 5), "a leftover of a finished command lived on"
            (tmp_path / "logs" / "train.log").unlink()  # as Snakemake does before a rerun
    kept = sorted(p.name for p in (tmp_path / "logs" / "attempts").iterdir())
    assert kept == ["train.log.1.log", "train.log.2.log"]
    for number, name in enumerate(kept, 1):
        text = (tmp_path / "logs" / "attempts" / name).read_text()
        assert text.startswith(f"# kwsflow attempt {number} started") and "training started" in text
    assert (tmp_path / "logs" / "train.log").read_text() == (tmp_path / "logs" / "attempts" / kept[1]).read_text()


def test_no_command_is_a_one_line_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "kws.supervise", "--log", str(tmp_path / "x.log")], capture_output=True, text=True
    )
    assert result.returncode == 1 and result.stderr.startswith("error: no command to run")
    assert not Path(tmp_path / "x.log").exists()
