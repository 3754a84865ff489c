"""Run a training command so that nothing of it outlives the run, and keep every attempt's log.

    python -m kws.supervise --log results/logs/train.x.log --watch-pid $PPID -- torchrun ... train.py ...

Snakemake deletes a job's log before each attempt and, when it is killed (`kill -9`, an OOM kill, a
lost SSH session), leaves the job's shell and everything under it running: torchrun and its ranks go
on training into the folder the rerun trains in. This wrapper:

- starts the command with its output in the log, and keeps the same file (a hard link) as
  `<log dir>/attempts/<log name>.<N>.log`, so earlier attempts' logs (a killed run's traceback) survive
  the rerun; the log's first line stamps the attempt (time, host, pid);
- watches `--watch-pid` (the Snakemake process; the job shell's $PPID) and its own parent: when either
  dies, or it gets SIGTERM/SIGINT/SIGHUP, it stops the whole tree (SIGTERM, then SIGKILL after
  `--grace` seconds);
- is the child subreaper of the tree (Linux): a process whose parent died (a killed rank's
  multiprocessing helpers, say) is handed to it instead of init, and it kills such
  orphans at once; when the command ends, whatever is left of the tree is killed too.

The exit status is the command's (128 + signal number when it was stopped).
"""

import argparse
import datetime
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from kws.errors import KwsError, cli

PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def become_subreaper():
    """Orphaned descendants are re-parented to this process instead of init (Linux; False elsewhere)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def attempt_log(log_path):
    """Open this attempt's log: `log_path`, hard-linked to the next free attempts/<name>.<N>.log."""
    log_path = Path(log_path)
    attempts = log_path.parent / "attempts"
    attempts.mkdir(parents=True, exist_ok=True)
    number = 1 + sum(1 for p in attempts.glob(f"{log_path.name}.*.log"))
    kept = attempts / f"{log_path.name}.{number}.log"
    # O_APPEND: the command's writes and ours (the reason for a stop) never overwrite each other.
    handle = os.fdopen(os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644), "a", encoding="utf-8")
    log_path.unlink(missing_ok=True)
    try:
        os.link(kept, log_path)
    except OSError:  # no hard links here (another filesystem): the attempt copy is the only one
        kept.unlink()
        kept = log_path
        handle.close()
        handle = open(log_path, "a", encoding="utf-8")
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    handle.write(
        f"# kwsflow attempt {number} started {stamp} on {socket.gethostname()} (pid {os.getpid()}); "
        f"every attempt's log: {attempts}/\n"
    )
    handle.flush()
    return handle


def _alive(process):
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_tree(processes, grace_s):
    """SIGTERM every process, SIGKILL those still alive after `grace_s` seconds."""
    for process in processes:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def supervise(command, log_path=None, watch_pid=None, grace_s=5.0, poll_s=0.25):
    """Run `command` under the rules above; returns its exit status."""
    me = psutil.Process()
    watched = [p for p in (me.parent(), _process(watch_pid)) if p is not None]
    become_subreaper()
    stopped = []
    for number in STOP_SIGNALS:
        signal.signal(number, lambda signum, frame: stopped.append(signum))
    output = attempt_log(log_path) if log_path else None
    try:
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT if output else None)
    except OSError as err:
        raise KwsError(f"cannot start {command[0]}: {err.strerror}") from None
    finally:
        if output is not None:
            output.close()
    while (status := child.poll()) is None:
        gone = [p.pid for p in watched if not _alive(p)]
        if stopped or gone:
            why = f"signal {stopped[0]}" if stopped else f"process {gone[0]} (the workflow or the job shell) died"
            _say(log_path, f"kws.supervise: {why}: stopping {command[0]} and everything it started")
            stop_tree([child, *(p for p in me.children(recursive=True) if p.pid != child.pid)], grace_s)
            child.wait()
            status = 128 + (stopped[0] if stopped else signal.SIGTERM)
            break
        orphans = [p for p in me.children() if p.pid != child.pid]
        if orphans:  # their parent died, so nobody else will ever stop them
            stop_tree([q for p in orphans for q in (p, *_children(p))], grace_s)
        time.sleep(poll_s)
    leftovers = me.children(recursive=True)
    if leftovers:
        stop_tree(leftovers, grace_s)
    return status if status >= 0 else 128 - status


def _say(log_path, message):
    """To the log first: the workflow that would read stderr may be the one that died."""
    try:
        if log_path:
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(message + "\n")
        print(message, file=sys.stderr, flush=True)
    except OSError:  # a closed pipe must not keep us from stopping the tree
        pass


def _process(pid):
    if pid is None:
        return None
    try:
        return psutil.Process(int(pid))
    except psutil.NoSuchProcess:
        raise KwsError(f"--watch-pid {pid}: no such process") from None


def _children(process):
    try:
        return process.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@cli
def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="python -m kws.supervise [--log LOG] [--watch-pid PID] -- command ...",
    )
    p.add_argument("--log", default=None, help="the command's log (its output); earlier attempts are kept")
    p.add_argument("--watch-pid", type=int, default=None, help="stop everything when this process dies")
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise KwsError("no command to run: python -m kws.supervise [options] -- command ...")
    return supervise(command, args.log, args.watch_pid, args.grace)


if __name__ == "__main__":
    sys.exit(main())
