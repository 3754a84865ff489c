"""Process-group set-up for training under torchrun, without silent hangs.

`init_distributed()` reads RANK / LOCAL_RANK / WORLD_SIZE (set by torchrun) and joins the process group.
Plain `torch.distributed.init_process_group` waits for a peer that never starts with a message that
names nobody (`Timed out after 600 seconds waiting for clients. 1/2 clients joined.`). Here every rank
first checks in at the rendezvous store (key `arrived/<rank>`) and waits at most `timeout_s` for the
others; on timeout *every* rank that is alive stops with one line naming the rank(s) that never arrived.

After init, `barrier_or_fail(timeout_s, what)` is a barrier that names the rank(s) that did not reach it
(torch's `monitored_barrier`, which only gloo implements; with NCCL it runs on a side gloo group that
`init_distributed` creates). The process-group timeout (`timeout_s`) bounds every other collective.

Failures raise `DistributedTimeout` (a `KwsError`): `kws.errors.cli` prints it as one `error: ...` line
and exits with status 1, and torchrun then stops the remaining workers.

World size 1 (no torchrun, or `--nproc_per_node 1`): no process group is created; `barrier_or_fail`,
`Dist` and `cleanup` still work (as no-ops / local values).

The trainer's side: `dist_env` (rank and sizes from torchrun's environment), `choose_device`,
`choose_threads`, and `Dist`, the few collectives the training loop makes.
"""

import datetime
import os
import re
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist

from kws.errors import KwsError


class DistributedTimeout(KwsError):
    """A peer did not arrive (or did not reach a barrier) in time; the message names the rank(s)."""


class _State:
    rank = 0
    world_size = 1
    backend = None
    device = torch.device("cpu")
    store = None  # the rendezvous store (raw), for our own keys
    prefix = "kws"
    monitor_group = None  # gloo group for monitored_barrier (None: use the default group)
    barriers = 0


_state = _State()


def _env_int(environ, name, default):
    value = environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise KwsError(f"environment variable {name}={value!r} is not an integer") from None


def resolve_backend(backend="auto", use_cuda=None, no_gpus="CUDA sees none"):
    """`auto` -> nccl when CUDA is usable (and NCCL there), else gloo (kws.preflight.choose_backend)."""
    from kws.preflight import choose_backend

    if use_cuda is None:
        use_cuda = torch.cuda.is_available()
    return choose_backend(backend, use_cuda, dist.is_nccl_available(), no_gpus, auto_needs_nccl=False)


def _timedelta(seconds):
    return datetime.timedelta(seconds=float(seconds))


def _connect_store(rank, world_size, timeout_s, environ):
    """A TCPStore on MASTER_ADDR:MASTER_PORT: torchrun's agent store when it serves one, else hosted by rank 0.

    Unlike torch's env:// rendezvous, rank 0 does not wait here for the others to connect (that wait
    times out naming nobody); the arrival check below does the waiting.
    """
    addr = environ.get("MASTER_ADDR")
    port = environ.get("MASTER_PORT")
    if not addr or not port:
        raise KwsError(f"WORLD_SIZE={world_size} but MASTER_ADDR/MASTER_PORT are not set; start training with torchrun")
    port = _env_int(environ, "MASTER_PORT", 0)
    agent = environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    is_master = rank == 0 and not agent
    try:
        if is_master:
            store = dist.TCPStore(
                addr, port, None, True, timeout=_timedelta(timeout_s), wait_for_workers=False, multi_tenant=True
            )
        else:
            store = dist.TCPStore(addr, port, None, False, timeout=_timedelta(timeout_s))
    except Exception as err:  # DistNetworkError / RuntimeError from C++
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if is_master and ("in use" in text.lower() or "bind" in text.lower()):
            holder = ""
            try:
                from kws.preflight import describe_port_holder

                holder = describe_port_holder(port)
            except Exception:  # best effort only
                pass
            raise KwsError(
                f"rank 0: cannot host the rendezvous store on {addr}:{port}: {text}"
                f"{' (' + holder + ')' if holder else ''}; pick another --master_port"
            ) from None
        if not is_master:
            raise DistributedTimeout(
                f"rank {rank}: could not reach the rendezvous store at {addr}:{port} within {timeout_s:g} s "
                f"({text}); rank 0 never started or died early: check its log"
            ) from None
        raise KwsError(f"rank {rank}: rendezvous store on {addr}:{port} failed: {text}") from None
    restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return store, f"kws/{restart}"


def _missing_keys(store, keys):
    missing = []
    for key in keys:
        try:
            if not store.check([key]):
                missing.append(key)
        except Exception:  # the store itself is gone (rank 0 died): everything is missing
            return list(keys)
    return missing


def _format_ranks(ranks):
    ranks = list(ranks)
    if len(ranks) > 16:
        return ", ".join(str(r) for r in ranks[:16]) + f", ... ({len(ranks)} ranks)"
    return ", ".join(str(r) for r in ranks)


def wait_for_ranks(store, rank, world_size, timeout_s, what="start", prefix="kws"):
    """Check in as `rank` under `<prefix>/<what>/<rank>` and wait (at most `timeout_s`) for all ranks.

    On timeout raise DistributedTimeout naming the missing ranks. Works on any c10d Store.
    """
    base = f"{prefix}/{what}"
    try:
        store.set(f"{base}/{rank}", f"{socket.gethostname()}:{os.getpid()}")
    except Exception as err:
        raise DistributedTimeout(
            f"rank {rank}: lost the rendezvous store while checking in for {what} "
            f"({str(err).splitlines()[0] if str(err) else type(err).__name__}); "
            f"rank 0 probably died: check its log"
        ) from None
    keys = [f"{base}/{r}" for r in range(world_size)]
    start = time.monotonic()
    try:
        store.wait(keys, _timedelta(timeout_s))
        return
    except Exception:
        pass
    waited = time.monotonic() - start
    missing = [int(key.rsplit("/", 1)[1]) for key in _missing_keys(store, keys)]
    if not missing:  # raced with the last arrival
        return
    raise DistributedTimeout(
        f"rank {rank}: rank(s) {_format_ranks(missing)} of {world_size} did not arrive at {what} within "
        f"{waited:.0f} s (timeout_s={timeout_s:g}); they crashed, hang or were never started: check their "
        f"logs (or raise train.timeout_s if they are just slow)"
    )


def init_distributed(backend="auto", timeout_s=600, environ=None, use_cuda=None):
    """Join the process group torchrun describes. Returns (rank, local_rank, world_size, device, backend).

    - `backend`: auto | nccl | gloo (auto: nccl when CUDA is usable, else gloo).
    - `timeout_s`: bounds the wait for peers at start-up and every collective afterwards.
    - Without torchrun (no WORLD_SIZE) or with WORLD_SIZE=1 no process group is created.
    - With nccl the device is `cuda:<LOCAL_RANK>` (set as the current device), else cpu.
    - Every rank checks in at the store first; a rank that never arrives is named in a
      DistributedTimeout on every rank that did, after `timeout_s`.
    """
    environ = os.environ if environ is None else environ
    rank = _env_int(environ, "RANK", 0)
    local_rank = _env_int(environ, "LOCAL_RANK", rank)
    world_size = _env_int(environ, "WORLD_SIZE", 1)
    if world_size < 1 or not 0 <= rank < world_size:
        raise KwsError(f"RANK={rank} / WORLD_SIZE={world_size} from the environment make no sense")
    if timeout_s is None or float(timeout_s) <= 0:
        raise KwsError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    backend = resolve_backend(backend, use_cuda)
    if backend == "nccl":
        if local_rank >= torch.cuda.device_count():
            raise KwsError(
                f"rank {rank}: LOCAL_RANK={local_rank} but CUDA sees only {torch.cuda.device_count()} "
                f"device(s) (CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                f"lower --nproc_per_node to the number of GPUs"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    _state.rank, _state.world_size, _state.backend, _state.device = rank, world_size, backend, device
    _state.barriers = 0
    if world_size == 1:
        return rank, local_rank, world_size, device, backend
    if dist.is_initialized():
        raise KwsError("init_distributed() called twice (the process group already exists)")

    store, prefix = _connect_store(rank, world_size, timeout_s, environ)
    _state.store, _state.prefix = store, prefix
    wait_for_ranks(store, rank, world_size, timeout_s, what="init_distributed", prefix=prefix)
    try:
        # The prefix carries torchrun's restart count: after a restart the agent's store still holds the
        # dead group's addresses, and a rank reading those would connect to nobody.
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"{prefix}/default_pg", store),
            rank=rank,
            world_size=world_size,
            timeout=_timedelta(timeout_s),
        )
    except Exception as err:
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DistributedTimeout(
            f"rank {rank}: init_process_group({backend}) failed after all ranks arrived: {text}"
        ) from None
    _state.monitor_group = None
    if backend != "gloo":
        # monitored_barrier is gloo-only: a side gloo group (a collective call: every rank makes it).
        _state.monitor_group = dist.new_group(backend="gloo", timeout=_timedelta(timeout_s))
    return rank, local_rank, world_size, device, backend


_FAILED_RANKS = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


def barrier_or_fail(timeout_s=600, what="barrier"):
    """A barrier that fails within `timeout_s`, naming the rank(s) that did not reach it.

    `what` says where in the run it is ("epoch 3 start"); it appears in the message. A no-op without a
    process group. Raises DistributedTimeout on every rank that reached it: on rank 0 with the missing
    ranks from monitored_barrier; on other ranks with the same list when rank 0 could publish it.
    """
    if not dist.is_available() or not dist.is_initialized():
        return
    _state.barriers += 1
    key = f"{_state.prefix}/barrier/{_state.barriers}/missing"
    rank = dist.get_rank()
    start = time.monotonic()
    try:
        dist.monitored_barrier(group=_state.monitor_group, timeout=_timedelta(timeout_s), wait_all_ranks=True)
        return
    except Exception as err:  # RuntimeError / DistBackendError
        text = str(err)
    waited = time.monotonic() - start
    match = _FAILED_RANKS.search(text)
    missing = None
    if match:
        missing = [int(r) for r in re.findall(r"\d+", match.group(1))]
    store = _state.store
    if rank == 0 and missing is not None and store is not None:
        try:
            store.set(key, ",".join(str(r) for r in missing))
            # rank 0 hosts the store: stay until the ranks that reached the barrier have read the list,
            # else this process's exit resets their connection before they do
            readers = dist.get_world_size() - 1 - len(missing)
            deadline = time.monotonic() + 5.0
            while store.add(f"{key}/read", 0) < readers and time.monotonic() < deadline:
                time.sleep(0.05)
        except Exception:
            pass
    elif missing is None and store is not None:
        try:  # rank 0 publishes the list when its own monitored_barrier gives up
            store.wait([key], _timedelta(min(10.0, max(5.0, 0.2 * float(timeout_s)))))
            value = store.get(key).decode()
            missing = [int(r) for r in value.split(",") if r]
            store.add(f"{key}/read", 1)
        except Exception:
            missing = None
    if missing:
        raise DistributedTimeout(
            f"rank {rank}: rank(s) {_format_ranks(missing)} did not reach {what} within {waited:.0f} s "
            f"(timeout_s={timeout_s:g}); they crashed or hang: check their logs"
        ) from None
    first = text.strip().splitlines()[0] if text.strip() else "no answer"
    raise DistributedTimeout(
        f"rank {rank}: {what}: no answer from rank 0 within {waited:.0f} s (timeout_s={timeout_s:g}): {first}; "
        f"rank 0 crashed or hangs: check its log"
    ) from None


def die_with_parent(parent=None):
    """Ask the kernel to SIGKILL this process when its parent exits (Linux PR_SET_PDEATHSIG).
    Returns True when armed. A process whose parent (`parent`, the pid that started it, when known) is
    already gone stops at once."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid() if parent is None else parent
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before the line above: nobody is left to report to
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def exit_with_launcher(environ=None):
    """Under torchrun, make this worker die with its launcher. Returns True when armed.

    torchrun starts each worker in a session of its own, so killing the launcher's process group
    (Ctrl-C on a wrapper, `kill -9` of a Snakemake run, a batch system reclaiming the job) leaves the
    workers running: they keep training and writing checkpoints into the model folder while the rerun
    trains there too. A worker whose launcher is already gone stops at once. Checkpoints are written
    atomically, so a killed worker leaves at most a `.epoch_NNN.pt.*.tmp` behind.
    """
    environ = os.environ if environ is None else environ
    if not environ.get("TORCHELASTIC_RUN_ID"):
        return False
    return die_with_parent()


def cleanup():
    """Destroy the process group (and the side gloo group) if there is one; safe to call twice."""
    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    _state.monitor_group = None
    _state.store = None
    _state.barriers = 0


# -- what the trainer needs: where it runs, and its collectives ------------------------------------


def dist_env(environ=None):
    """rank, local_rank, world_size, local_world_size from torchrun's environment (1 process without it)."""
    environ = os.environ if environ is None else environ
    world_size = _env_int(environ, "WORLD_SIZE", 1)
    rank = _env_int(environ, "RANK", 0)
    local_rank = _env_int(environ, "LOCAL_RANK", rank)
    local_world = _env_int(environ, "LOCAL_WORLD_SIZE", world_size)
    return rank, local_rank, world_size, local_world


def choose_device(gpus, local_rank, local_world):
    """cpu, or cuda:<local_rank> among the visible devices (`--gpus` ids, WeKws's convention; -1 = CPU)."""
    spec = None if gpus is None else str(gpus).strip()
    if spec in ("-1", "cpu", ""):
        return torch.device("cpu")
    ids = [x.strip() for x in spec.split(",") if x.strip()] if spec else []
    if ids:
        if local_world > len(ids):
            raise KwsError(f"--gpus {spec}: {len(ids)} id(s) for {local_world} processes per node")
        if "CUDA_VISIBLE_DEVICES" not in os.environ:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)  # before CUDA initialises
    if not torch.cuda.is_available():
        if ids:
            raise KwsError(
                f"--gpus {spec}: CUDA cannot use any device here (torch.cuda.is_available() is False, "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): a GPU "
                f"training stops rather than train on the CPU (gpus: 0 / --gpus -1 trains on the CPU)"
            )
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise KwsError(
            f"local rank {local_rank} has no GPU: only {torch.cuda.device_count()} visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    return torch.device("cuda", local_rank)


def choose_threads(threads, local_world):
    """Threads per process: the job's `threads` shared by the processes of a node, else
    $OMP_NUM_THREADS, else the cores available shared the same way."""
    if threads is not None:
        if threads < 1:
            raise KwsError(f"--threads must be >= 1, got {threads}")
        return max(1, threads // max(1, local_world))
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world))


class Dist:
    """The few collectives the training loop needs; no-ops for a single process."""

    def __init__(self, world_size, device, backend):
        self.world_size = world_size
        self.enabled = world_size > 1
        # NCCL reduces CUDA tensors only; gloo reduces CPU tensors.
        self.device = device if backend == "nccl" else torch.device("cpu")

    def sum(self, values):
        """Element-wise sum over ranks of a list of numbers (float64)."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.enabled:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.cpu().tolist()

    def sync_buffers(self, model):
        """Rank 0's buffers (BatchNorm statistics) everywhere, so CV uses the model rank 0 saves."""
        if self.enabled:
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)

    def barrier(self, what, timeout_s):
        """A barrier that fails within the timeout, naming the rank(s) that never reached it."""
        if self.enabled:
            barrier_or_fail(timeout_s, what)

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]
