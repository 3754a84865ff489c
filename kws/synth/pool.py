"""The synthesis worker pool: spawned processes, each rendering one chunk of a corpus at a time.

Each worker initialises eSpeak once (every chunk forks a pristine eSpeak child from that state, see
kws.synth.espeak) and runs `work(chunk, *args, log)` (kws.synth.corpus.render_chunk) on the chunks it is
sent. A worker that dies is replaced and its chunk retried; a chunk whose worker died MAX_WORKER_DEATHS
times is skipped (its items reported as skipped).
"""

import multiprocessing
import os
from collections import deque
from multiprocessing.connection import wait

from kws.synth.engine_base import environment

MAX_WORKER_DEATHS = 2  # a chunk whose worker process died this often is skipped


def _worker_main(conn, work, args):
    """A worker process: `work(chunk, *args, log)` for each chunk received, its records sent back."""
    from kws.synth.espeak import engine

    engine()  # initialise once; every chunk forks from this state
    while True:
        job = conn.recv()
        if job is None:
            break
        chunk, attempt = job
        if attempt == 0 and chunk.get("_kill_worker"):  # fault injection for tests (kws.synth.faults)
            os._exit(9)
        warnings = []
        # work calls the lambda before this iteration ends: it appends to this chunk's list
        records = work(chunk, *args, lambda message: warnings.append(f"warning: {message}"))  # noqa: B023
        conn.send((chunk["id"], records, warnings))
    conn.close()


class WorkerPool:
    """Spawned workers fed one chunk at a time; a worker that dies is replaced and its chunk retried."""

    def __init__(self, threads, work, args, log):
        self.ctx = multiprocessing.get_context("spawn")
        self.threads, self.work, self.args, self.log = threads, work, tuple(args), log
        self.workers = []

    def _start(self):
        parent, child = self.ctx.Pipe()
        with environment(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1"):
            proc = self.ctx.Process(target=_worker_main, args=(child, self.work, self.args), daemon=True)
            proc.start()
        child.close()
        worker = {"proc": proc, "conn": parent, "job": None}
        self.workers.append(worker)
        return worker

    def run(self, chunks):
        pending = deque((chunk, 0) for chunk in chunks)
        results = {}
        try:
            while pending or any(w["job"] for w in self.workers):
                while pending and len(self.workers) < min(self.threads, len(chunks)):
                    self._start()
                for worker in self.workers:
                    if worker["job"] is None and pending:
                        worker["job"] = pending.popleft()
                        worker["conn"].send(worker["job"])
                busy = [w for w in self.workers if w["job"] is not None]
                ready = wait([w["conn"] for w in busy] + [w["proc"].sentinel for w in busy])
                for worker in busy:
                    if worker["conn"] in ready:
                        try:
                            chunk_id, records, warnings = worker["conn"].recv()
                        except (EOFError, OSError):
                            self._died(worker, pending, results)
                            continue
                        for message in warnings:
                            self.log(message)
                        results[chunk_id] = records
                        worker["job"] = None
                    elif worker["proc"].sentinel in ready:
                        self._died(worker, pending, results)
        finally:
            self.close()
        return [results[chunk["id"]] for chunk in chunks]

    def _died(self, worker, pending, results):
        chunk, attempt = worker["job"]
        worker["proc"].join()
        code = worker["proc"].exitcode
        self.workers.remove(worker)
        worker["conn"].close()
        if attempt + 1 < MAX_WORKER_DEATHS:
            self.log(f"warning: synthesis worker died (exit {code}) on chunk {chunk['id']}; retrying it")
            pending.appendleft((chunk, attempt + 1))
        else:
            self.log(
                f"warning: synthesis worker died (exit {code}) on chunk {chunk['id']} again; "
                f"skipping its {len(chunk['items'])} items"
            )
            results[chunk["id"]] = [{"key": i["key"], "split": i["split"], "skipped": True} for i in chunk["items"]]

    def close(self):
        for worker in self.workers:
            try:
                worker["conn"].send(None)
            except (BrokenPipeError, OSError):
                pass
        for worker in self.workers:
            worker["proc"].join(timeout=10)
            if worker["proc"].is_alive():
                worker["proc"].kill()
                worker["proc"].join()
            worker["conn"].close()
        self.workers = []
