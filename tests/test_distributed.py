"""kws.distributed on CPU (gloo): no silent hangs, the missing rank is named, weighted cv-loss all-reduce."""

import multiprocessing
import os
import queue
import socket
import time
from pathlib import Path

import pytest
import torch

from kws import distributed
from kws.errors import KwsError

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 3  # seconds given to init_distributed / barrier_or_fail in the workers

# Ranks are forked from a forkserver that has imported torch once: starting a fresh interpreter per rank
# costs seconds of torch import each on a busy machine.
CTX = multiprocessing.get_context("forkserver")
CTX.set_forkserver_preload(["torch", "torch.distributed", "kws.distributed"])


def worker(rank, world_size, port, mode, timeout, results):
    """One rank: init, (maybe hang), barrier, weighted mean; reports (rank, status, lines, elapsed)."""
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "CUDA_VISIBLE_DEVICES": "",
        }
    )
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    from kws import distributed as D

    lines = []
    start = time.monotonic()
    try:
        r, _, world, device, backend = D.init_distributed("auto", timeout_s=timeout, use_cuda=False)
        lines.append(f"init rank={r} world={world} device={device} backend={backend}")
        if mode == "skip_barrier" and rank == world - 1:
            time.sleep(timeout + 30)  # hangs before the barrier (the test kills it)
        start = time.monotonic()
        D.barrier_or_fail(timeout, "epoch 1 start")
        lines.append("barrier passed")
        weighted, count = D.Dist(world, device, backend).sum([float(rank + 1) * (rank + 1), rank + 1])
        lines.append(f"mean={weighted / count:.6f}")
        D.cleanup()
        results.put((rank, 0, lines, time.monotonic() - start))
    except KwsError as err:
        lines.append(f"error: {err}")
        results.put((rank, 1, lines, time.monotonic() - start))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(ranks, world_size, mode="ok", timeout=TIMEOUT, wanted=None, limit=60):
    """Start `ranks` of a `world_size` job; collect the reports of `wanted` ranks (default all), then kill
    whatever is left. Returns {rank: (status, lines, elapsed)}."""
    results = CTX.Queue()
    port = free_port()
    procs = [
        CTX.Process(target=worker, args=(rank, world_size, port, mode, timeout, results), daemon=True) for rank in ranks
    ]
    for proc in procs:
        proc.start()
    wanted = list(ranks) if wanted is None else wanted
    reports = {}
    try:
        while len(reports) < len(wanted):
            try:
                rank, status, lines, took = results.get(timeout=limit)
            except queue.Empty:
                pytest.fail(f"ranks hung: got reports from {sorted(reports)} only")
            reports[rank] = (status, lines, took)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)
    return reports


def test_world_size_one_needs_no_process_group():
    rank, local_rank, world, device, backend = distributed.init_distributed("auto", 5, environ={}, use_cuda=False)
    assert (rank, local_rank, world, device.type, backend) == (0, 0, 1, "cpu", "gloo")
    assert not torch.distributed.is_initialized()
    distributed.barrier_or_fail(1, "nothing")
    assert distributed.Dist(1, device, backend).sum([0.5, 10]) == [0.5, 10.0]
    distributed.cleanup()


def test_backend_choice():
    assert distributed.resolve_backend("auto", use_cuda=False) == "gloo"
    with pytest.raises(KwsError, match="nccl needs GPUs"):
        distributed.resolve_backend("nccl", use_cuda=False)
    with pytest.raises(KwsError, match="unknown backend"):
        distributed.resolve_backend("mpi", use_cuda=False)
    with pytest.raises(KwsError, match="MASTER_ADDR/MASTER_PORT are not set"):
        distributed.init_distributed("gloo", 5, environ={"RANK": "0", "WORLD_SIZE": "2"}, use_cuda=False)


def test_two_ranks_barrier_and_weighted_mean():
    reports = run_ranks([0, 1], 2)
    for rank, (status, lines, _) in reports.items():
        assert status == 0, lines
        # rank 0: value 1 over 1 item, rank 1: value 2 over 2 items -> (1 + 4) / 3
        assert lines == [f"init rank={rank} world=2 device=cpu backend=gloo", "barrier passed", "mean=1.666667"]


def test_rank_that_never_starts_is_named():
    """Rank 1 of 2 never starts: rank 0 gives up after the timeout naming rank 1 (torch alone says
    `1/2 clients joined`, and with the default timeout only after 10 minutes)."""
    wall = time.monotonic()
    status, lines, took = run_ranks([0], 2)[0]
    wall = time.monotonic() - wall
    assert status == 1
    assert lines[-1].startswith("error: rank 0: rank(s) 1 of 2 did not arrive at init_distributed within 3 s")
    assert TIMEOUT - 0.5 <= took <= TIMEOUT + 5  # margin for a loaded 2-core machine; no hang is minutes
    assert wall < TIMEOUT + 30  # includes starting the forkserver (one torch import) on a busy machine


def test_missing_rank_zero_is_named():
    status, lines, took = run_ranks([1], 2, timeout=1.5)[1]
    assert status == 1
    assert lines[-1].startswith("error: rank 1: could not reach the rendezvous store at 127.0.0.1:")
    assert "rank 0 never started or died early" in lines[-1]
    assert took <= 2 * 1.5 + 6  # the TCPStore client tries twice; margin for a loaded machine


def test_rank_that_never_reaches_the_barrier_is_named_on_every_rank():
    """3 ranks; rank 2 joins init but hangs before the barrier: ranks 0 and 1 both stop within the
    timeout naming rank 2 (rank 1 learns the list from rank 0 through the store)."""
    reports = run_ranks([0, 1, 2], 3, mode="skip_barrier", wanted=[0, 1])
    for rank in (0, 1):
        status, lines, took = reports[rank]
        assert status == 1, lines
        assert lines[-1].startswith(f"error: rank {rank}: rank(s) 2 did not reach epoch 1 start within")
        assert took <= TIMEOUT + 8
