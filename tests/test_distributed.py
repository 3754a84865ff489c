"""kws.distributed on CPU (gloo): no silent hangs, the missing rank is named, weighted cv-loss all-reduce."""

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kws import distributed
from kws.errors import KwsError

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 3  # seconds given to init_distributed / barrier_or_fail in the workers

WORKER = textwrap.dedent("""
    import os, sys, time
    from kws import distributed as D
    from kws.errors import KwsError

    mode, timeout = sys.argv[1], float(sys.argv[2])
    rank = int(os.environ["RANK"])
    start = time.monotonic()
    try:
        r, local_rank, world, device, backend = D.init_distributed("auto", timeout_s=timeout)
        print(f"init rank={r} world={world} device={device} backend={backend}", flush=True)
        if mode == "skip_barrier" and rank == world - 1:
            time.sleep(timeout + 15)  # hangs (the test kills it)
            sys.exit(0)
        start = time.monotonic()
        D.barrier_or_fail(timeout, "epoch 1 start")
        print("barrier passed", flush=True)
        mean = D.all_reduce_mean_weighted(float(rank + 1), rank + 1)
        print(f"mean={mean:.6f}", flush=True)
        D.cleanup()
    except KwsError as err:
        print(f"error: {err}", flush=True)
        print(f"elapsed={time.monotonic() - start:.2f}", flush=True)
        sys.exit(1)
""")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_ranks(tmp_path, ranks, world_size, mode="ok", timeout=TIMEOUT):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    procs = {}
    for rank in ranks:
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs[rank] = subprocess.Popen([sys.executable, str(script), mode, str(timeout)], env=env, cwd=ROOT,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return procs


def finish(proc, limit=60):
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"worker hung:\n{out}\n{err[-2000:]}")
    return proc.returncode, out, err


def elapsed(out):
    return float(out.strip().splitlines()[-1].split("=", 1)[1])


def test_world_size_one_needs_no_process_group():
    rank, local_rank, world, device, backend = distributed.init_distributed("auto", 5, environ={}, use_cuda=False)
    assert (rank, local_rank, world, device.type, backend) == (0, 0, 1, "cpu", "gloo")
    assert not torch.distributed.is_initialized()
    distributed.barrier_or_fail(1, "nothing")
    assert distributed.all_reduce_mean_weighted(0.5, 10) == 0.5
    assert distributed.all_reduce_mean_weighted(torch.tensor(0.25), torch.tensor(3)) == 0.25
    assert distributed.is_main_process()
    distributed.cleanup()


def test_backend_choice():
    assert distributed.resolve_backend("auto", use_cuda=False) == "gloo"
    with pytest.raises(KwsError, match="nccl needs GPUs"):
        distributed.resolve_backend("nccl", use_cuda=False)
    with pytest.raises(KwsError, match="unknown distributed backend"):
        distributed.resolve_backend("mpi", use_cuda=False)
    with pytest.raises(KwsError, match="MASTER_ADDR/MASTER_PORT are not set"):
        distributed.init_distributed("gloo", 5, environ={"RANK": "0", "WORLD_SIZE": "2"}, use_cuda=False)


def test_two_ranks_barrier_and_weighted_mean(tmp_path):
    procs = start_ranks(tmp_path, [0, 1], 2)
    for rank, proc in procs.items():
        code, out, err = finish(proc)
        assert code == 0, err[-2000:]
        assert f"init rank={rank} world=2 device=cpu backend=gloo" in out
        assert "barrier passed" in out
        # rank 0: value 1 over 1 item, rank 1: value 2 over 2 items -> (1 + 4) / 3
        assert "mean=1.666667" in out


def test_rank_that_never_starts_is_named(tmp_path):
    """Rank 1 of 2 never starts: rank 0 gives up after the timeout naming rank 1 (torch alone says
    `1/2 clients joined`, and with the default timeout waits 10 minutes first)."""
    wall = time.monotonic()
    code, out, _ = finish(start_ranks(tmp_path, [0], 2)[0])
    wall = time.monotonic() - wall
    assert code == 1
    assert "error: rank 0: rank(s) 1 of 2 did not arrive at init_distributed within 3 s" in out
    assert TIMEOUT - 0.5 <= elapsed(out) <= TIMEOUT + 2
    assert wall < TIMEOUT + 30  # python + torch start-up on a busy machine


def test_missing_rank_zero_is_named(tmp_path):
    code, out, _ = finish(start_ranks(tmp_path, [1], 2, timeout=2)[1])
    assert code == 1
    assert "error: rank 1: could not reach the rendezvous store at 127.0.0.1:" in out
    assert "rank 0 never started or died early" in out
    assert elapsed(out) <= 2 * 2 + 3  # the TCPStore client tries twice


def test_rank_that_never_reaches_the_barrier_is_named_on_every_rank(tmp_path):
    """3 ranks; rank 2 joins init but hangs before the barrier: ranks 0 and 1 both exit within the
    timeout naming rank 2 (rank 1 learns the list from rank 0 through the store)."""
    procs = start_ranks(tmp_path, [0, 1, 2], 3, mode="skip_barrier")
    try:
        for rank in (0, 1):
            code, out, err = finish(procs[rank])
            assert code == 1, err[-2000:]
            assert f"error: rank {rank}: rank(s) 2 did not reach epoch 1 start within" in out
            assert elapsed(out) <= TIMEOUT + 4
    finally:
        procs[2].kill()
        procs[2].communicate()
