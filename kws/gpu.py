"""Which GPUs a job gets: one lock file per GPU id, and free ports for torchrun.

Snakemake's `--resources gpu=N` counts GPUs but never says which ones a job may use (it never sets
CUDA_VISIBLE_DEVICES). This module takes N free ids from the visible set by locking
`<lock_dir>/gpu<id>.lock` with `fcntl.flock(LOCK_EX | LOCK_NB)`. A flock belongs to the open file, so
the kernel drops it when the holder exits for any reason (crash, SIGKILL, OOM kill): no stale locks.

Locks are taken in `<lock dir>/<host>` (`<host>-slurm<job id>` inside a SLURM job, see lock_scope): only
jobs that can share a device compete.

As a wrapper command it holds the locks for the life of the child and exports CUDA_VISIBLE_DEVICES:

    python -m kws.gpu --gpus 2 --lock-dir results/.gpu-locks -- torchrun --standalone ... scripts/train.py

The wrapper *execs* the command (the locked files stay open across exec), so the locks live exactly as
long as the command, signals reach it directly and its exit status is the wrapper's. The same wrapper
also hands out a free TCP port (`KWS_FREE_PORT`, and `{free_port}` in the command is replaced by it),
reserved by a lock file too, so two jobs started together never pick the same --master_port.

Waiting: when fewer than N ids are free, it retries (all or nothing, so two waiting jobs never hold
half each) until `--timeout` seconds have passed (default: wait forever; 0: fail at once). Asking for
more GPUs than are visible at all is an immediate error.

The visible set: `--visible 0,1,2` / env `KWS_VISIBLE_GPUS` (also how tests fake GPUs), else
CUDA_VISIBLE_DEVICES if set (the allocator then picks among those ids), else `nvidia-smi -L`.
"""

import argparse
import contextlib
import errno
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from kws.errors import KwsError, cli

DEFAULT_LOCK_DIR = "/tmp/kwsflow-gpu-locks"
DEFAULT_POLL = 2.0


def visible_gpus(visible=None):
    """The GPU ids this job may choose from (strings, as CUDA_VISIBLE_DEVICES wants them)."""
    for source in (visible, os.environ.get("KWS_VISIBLE_GPUS"), os.environ.get("CUDA_VISIBLE_DEVICES")):
        if source is None:
            continue
        if isinstance(source, (list, tuple)):
            return [str(x) for x in source]
        source = str(source).strip()
        if source in ("", "-1", "none"):
            return []
        return [part.strip() for part in source.split(",") if part.strip()]
    return _nvidia_smi_ids()


def _nvidia_smi_ids():
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def _open_lock(path):
    """An fd on the lock file (created world-writable so jobs of several users can share a lock dir)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY)  # someone else's file: flock works on a read-only fd too
    return fd


def _try_lock(path):
    fd = _open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    with contextlib.suppress(OSError):  # who holds it, for people reading the lock dir
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(), 0)
    return fd


def lock_scope(environ=None):
    """The folder under the lock dir whose locks this process competes for: the jobs that share devices.

    Those are the jobs on this host (the lock dir may sit on a filesystem that other machines share), and
    inside a SLURM job only the jobs of that allocation: SLURM assigns each job its own devices, and
    numbers them from 0 on every node, so the locks of another job or node must not be waited for.
    """
    environ = os.environ if environ is None else environ
    host = socket.gethostname().split(".")[0]
    job = environ.get("SLURM_JOB_ID")
    return f"{host}-slurm{job}" if job else host


def _lock_dir(lock_dir):
    path = Path(lock_dir or os.environ.get("KWS_GPU_LOCK_DIR") or DEFAULT_LOCK_DIR) / lock_scope()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise KwsError(f"{path}: cannot create the GPU lock folder ({err.strerror})") from None
    return path


class Allocation:
    """GPU ids held through open, flocked files; `release()` (or exit) frees them."""

    def __init__(self, ids, fds):
        self.ids, self.fds = list(ids), list(fds)

    @property
    def cuda_visible_devices(self):
        return ",".join(self.ids)

    def release(self):
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def try_acquire(count, visible=None, lock_dir=None):
    """Take `count` free ids now (all or nothing): an Allocation, or None when not enough are free."""
    ids = visible_gpus(visible)
    if count > len(ids):
        raise KwsError(
            f"asked for {count} GPU(s) but only {len(ids)} visible ({','.join(ids) or 'none'}); "
            f"set --visible/KWS_VISIBLE_GPUS or ask for fewer"
        )
    folder = _lock_dir(lock_dir)
    taken, fds = [], []
    for gpu in ids:
        if len(taken) == count:
            break
        fd = _try_lock(folder / f"gpu{gpu}.lock")
        if fd is not None:
            taken.append(gpu)
            fds.append(fd)
    if len(taken) < count:
        Allocation(taken, fds).release()
        return None
    return Allocation(taken, fds)


def acquire(count, visible=None, lock_dir=None, timeout=None, poll=DEFAULT_POLL, log=None):
    """Take `count` free GPU ids, waiting (up to `timeout` seconds; None = forever) until they are."""
    count = int(count)
    if count < 0:
        raise KwsError(f"number of GPUs must be >= 0, got {count}")
    if count == 0:
        return Allocation([], [])
    start = time.monotonic()
    told = False
    while True:
        allocation = try_acquire(count, visible, lock_dir)
        if allocation is not None:
            return allocation
        waited = time.monotonic() - start
        if timeout is not None and waited >= timeout:
            raise KwsError(
                f"no {count} free GPU(s) among {','.join(visible_gpus(visible))} after {waited:.0f} s "
                f"(locks in {_lock_dir(lock_dir)})"
            )
        if log is not None and not told:
            log(f"kws.gpu: waiting for {count} free GPU(s) (locks in {_lock_dir(lock_dir)})")
            told = True
        time.sleep(poll if timeout is None else max(0.0, min(poll, timeout - waited)))


def free_port(lock_dir=None, host="127.0.0.1", reserve=True):
    """A TCP port free right now; with `reserve`, also locked (`port<N>.lock`) so that no other kwsflow
    job gets it while the returned fd is open. Returns (port, fd or None)."""
    from kws.preflight import ephemeral_port

    for _ in range(100):
        port = ephemeral_port(host)
        if not reserve:
            return port, None
        fd = _try_lock(_lock_dir(lock_dir) / f"port{port}.lock")
        if fd is not None:
            return port, fd
    raise KwsError("could not find a free TCP port")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m kws.gpu",
        description="Take N free GPUs (one lock file per id), set CUDA_VISIBLE_DEVICES and run a command "
        "holding the locks. Without a command, print the ids that are free now.",
    )
    parser.add_argument("--gpus", type=int, required=True, help="number of GPUs to take (0: just run)")
    parser.add_argument(
        "--lock-dir", default=None, help=f"lock folder (default $KWS_GPU_LOCK_DIR or {DEFAULT_LOCK_DIR})"
    )
    parser.add_argument(
        "--visible",
        default=None,
        help="ids to choose from (default: $KWS_VISIBLE_GPUS, $CUDA_VISIBLE_DEVICES, nvidia-smi)",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for free GPUs (default: forever)")
    parser.add_argument("--poll", type=float, default=DEFAULT_POLL, help="seconds between tries")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    allocation = acquire(args.gpus, args.visible, args.lock_dir, args.timeout, args.poll, log=log)
    if not command:
        print(allocation.cuda_visible_devices)
        return 0
    port, port_fd = free_port(args.lock_dir)
    env = dict(os.environ)
    if args.gpus > 0:
        env["CUDA_VISIBLE_DEVICES"] = allocation.cuda_visible_devices
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # ids as nvidia-smi numbers them
    env["KWS_FREE_PORT"] = str(port)
    command = [part.replace("{free_port}", str(port)) for part in command]
    for fd in allocation.fds + [port_fd]:
        os.set_inheritable(fd, True)  # the locks must survive exec: the command holds them from now on
    log(f"kws.gpu: CUDA_VISIBLE_DEVICES={allocation.cuda_visible_devices or '(none)'} port={port}: {' '.join(command)}")
    try:
        os.execvpe(command[0], command, env)
    except OSError as err:
        raise KwsError(f"{command[0]}: cannot run ({err.strerror})") from None


if __name__ == "__main__":
    sys.exit(cli(main)())
