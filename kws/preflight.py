"""The multi-GPU checklist as code: catch the usual causes of obscure DDP failures before training starts.

`run_preflight(args)` checks, in order, and raises KwsError (one line saying what to change) on the
first failure; it returns the warnings (a list of str) and keeps the "OK" lines in `.ok`:

1. `--gpus` (WeKws style "0,1"; "-1" or empty = CPU): ids unique and non-negative, as many as
   torchrun's `--nproc_per_node` (LOCAL_WORLD_SIZE under torchrun). WeKws indexes `gpus` by rank and
   fails with an IndexError or two ranks on one GPU otherwise.
2. Every requested GPU visible to CUDA (ids index the devices CUDA_VISIBLE_DEVICES leaves visible),
   with its free memory reported as an OK line (a warning when most of it is taken by someone else).
3. The backend: `auto` -> nccl with GPUs, gloo without; nccl needs GPUs and an NCCL build.
4. `training_config.grad_clip` set (warning naming the default, 50, when absent; error when not > 0).
5. The rendezvous port free (not checked inside torchrun, whose agent holds it): if it is taken the
   error names the process listening on it and suggests a free port (or, with `choose_port=True`,
   takes it and warns).
6. `num_workers` sensible for the CPUs the job has (`--threads`, else the affinity mask):
   negative is an error, nproc_per_node * (num_workers + 1) > cpus a warning with a suggestion.

CUDA is queried through a `CudaInfo` (injectable: tests pass `CudaInfo.fake(...)`).
"""

import dataclasses
import errno
import ipaddress
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

from kws.errors import KwsError

DEFAULT_GRAD_CLIP = 50.0
DEFAULT_MASTER_PORT = 29500
BACKENDS = ("auto", "nccl", "gloo")
GIB = 1024**3


# --------------------------------------------------------------------------------------------- CUDA


@dataclasses.dataclass
class CudaInfo:
    """What CUDA shows this process (after CUDA_VISIBLE_DEVICES): device i is `cuda:i`.

    `free_bytes` / `total_bytes` hold one entry per device, None where not queried.
    """

    device_count: int = 0
    names: list = dataclasses.field(default_factory=list)
    free_bytes: list = dataclasses.field(default_factory=list)
    total_bytes: list = dataclasses.field(default_factory=list)
    nccl_available: bool = False

    @classmethod
    def query(cls, memory_for=None):
        """Ask torch. Free/total memory (torch.cuda.mem_get_info) only for the ids in `memory_for`
        (None: all devices): each query creates a CUDA context on that device."""
        import torch

        try:
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception:  # a broken driver: treat as no GPU, the checks then say so
            count = 0
        try:
            nccl = bool(torch.distributed.is_available() and torch.distributed.is_nccl_available())
        except Exception:
            nccl = False
        names, free, total = [], [], []
        for i in range(count):
            try:
                names.append(torch.cuda.get_device_name(i))
            except Exception:
                names.append("?")
            f = t = None
            if memory_for is None or i in memory_for:
                try:
                    f, t = torch.cuda.mem_get_info(i)
                except Exception:
                    pass
            free.append(f)
            total.append(t)
        return cls(count, names, free, total, nccl)

    @classmethod
    def fake(
        cls, physical=0, free_gib=None, total_gib=80.0, name="Fake GPU", nccl_available=True, cuda_visible_devices=None
    ):
        """A pretend machine with `physical` GPUs, seen through `cuda_visible_devices` like CUDA does
        (the listed ids in order, stopping at the first invalid one). `free_gib`: one number or a list
        per physical GPU (default: all free)."""
        if free_gib is None:
            free_gib = total_gib
        frees = list(free_gib) if isinstance(free_gib, (list, tuple)) else [free_gib] * physical
        ids = list(range(physical))
        if cuda_visible_devices is not None:
            ids = []
            for part in str(cuda_visible_devices).split(","):
                part = part.strip()
                if not part.isdigit() or int(part) >= physical or int(part) in ids:
                    break
                ids.append(int(part))
        return cls(
            len(ids),
            [f"{name} {i}" for i in ids],
            [int(frees[i] * GIB) for i in ids],
            [int(total_gib * GIB) for _ in ids],
            nccl_available,
        )


# -------------------------------------------------------------------------------------------- ports


def _hex_to_ip(text):
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    # IPv6: four 32-bit words, each in host (little-endian) order
    return str(ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))))


def listening_sockets(port, proc="/proc"):
    """[(address, inode, uid)] of TCP sockets listening on `port`, from /proc/net/tcp and tcp6."""
    found = []
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(proc, "net", name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A = LISTEN
                continue
            addr, _, hexport = fields[1].rpartition(":")
            if int(hexport, 16) != port:
                continue
            try:
                address = _hex_to_ip(addr)
            except ValueError:
                address = addr
            found.append((address, int(fields[9]), int(fields[7])))
    return found


def _pids_holding(inodes, proc="/proc"):
    """{inode: [pid]} for the socket inodes, scanning /proc/<pid>/fd (processes we may read)."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    holders = {inode: [] for inode in inodes}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return holders
    for pid in pids:
        fd_dir = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in wanted and int(pid) not in holders[wanted[target]]:
                holders[wanted[target]].append(int(pid))
    return holders


def _describe_pid(pid, proc="/proc"):
    try:
        cmd = Path(proc, str(pid), "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    if not cmd:
        try:
            cmd = Path(proc, str(pid), "comm").read_text().strip()
        except OSError:
            cmd = "?"
    cmd = " ".join(cmd.split())
    if len(cmd) > 120:
        cmd = cmd[:117] + "..."
    return f"pid {pid} ({cmd})"


def _ss_holders(port):
    """Best-effort fallback: `ss -ltnpH` names the holder even when /proc/<pid>/fd is not readable to us."""
    if shutil.which("ss") is None:
        return []
    try:
        out = subprocess.run(
            ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [f"pid {pid} ({name})" for name, pid in re.findall(r'\("([^"]*)",pid=(\d+)', out)]


def describe_port_holder(port, proc="/proc"):
    """Who listens on TCP `port`: e.g. 'pid 1234 (python train.py ...)', '' when nobody is seen."""
    sockets = listening_sockets(port, proc)
    if not sockets:
        return ""
    holders = _pids_holding([inode for _, inode, _ in sockets], proc)
    pids = sorted({pid for pids in holders.values() for pid in pids})
    if pids:
        return ", ".join(_describe_pid(pid, proc) for pid in pids)
    named = _ss_holders(port)
    if named:
        return ", ".join(dict.fromkeys(named))
    uids = sorted({uid for _, _, uid in sockets})
    return f"a process of uid {','.join(map(str, uids))} that we may not inspect"


def port_is_free(port, host=""):
    """Whether a server could listen on `port` now (SO_REUSEADDR, as torch's TCPStore: a TIME_WAIT left
    by a dead run does not count, a listener on any address does). `host` "" = all addresses."""
    families = [socket.AF_INET6, socket.AF_INET] if host in ("", "::") and socket.has_ipv6 else [socket.AF_INET]
    for family in families:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                if family == socket.AF_INET6:
                    sock.bind(("::" if host == "" else host, port))
                else:
                    sock.bind(("0.0.0.0" if host in ("", "::") else host, port))
                sock.listen(1)
            except OSError as err:
                if err.errno in (errno.EADDRINUSE, errno.EACCES):
                    return False
                continue  # e.g. no IPv6 on this host: the other family decides
    return True


def find_free_port(start=DEFAULT_MASTER_PORT + 1, host="", tries=200):
    """The first free port at or after `start` (nice to type), else one the kernel picks."""
    for port in range(max(1024, start), min(65535, start + tries)):
        if port_is_free(port, host):
            return port
    return ephemeral_port()


def ephemeral_port(host=""):
    """A TCP port the kernel finds free now on `host` ("" = all addresses); nothing holds it afterwards."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_port(port, host="", choose=False, proc="/proc"):
    """Return `port` if free. If taken: KwsError naming the holder and a free port to use instead, or
    with `choose=True` return (that free port, warning text)."""
    port = int(port)
    if not 0 < port < 65536:
        raise KwsError(f"--master_port {port} is not a TCP port (1..65535)")
    if port_is_free(port, host):
        return port, None
    holder = describe_port_holder(port, proc) or "an unknown process"
    other = find_free_port(port + 1, host)
    text = (
        f"rendezvous port {port} is already in use (held by {holder}; a dead training run?): "
        f"kill it or use --master_port {other}"
    )
    if choose:
        return other, f"{text}; using --master_port {other}"
    raise KwsError(text)


# ------------------------------------------------------------------------------------------- checks


class PreflightReport(list):
    """The warnings (a list of str), plus `.ok` (info lines), `.backend`, `.gpus`, `.nproc_per_node`,
    `.master_port`, `.cpus`."""

    def __init__(self):
        super().__init__()
        self.ok = []
        self.backend = None
        self.gpus = []
        self.nproc_per_node = None
        self.master_port = None
        self.cpus = None


def _get(args, *names, default=None):
    for name in names:
        if isinstance(args, dict):
            if args.get(name) is not None:
                return args[name]
        elif getattr(args, name, None) is not None:
            return getattr(args, name)
    return default


def parse_gpus(gpus):
    """WeKws `--gpus`: "0,1" -> [0, 1]; None, "", "-1" -> [] (CPU). Ids must be unique and >= 0."""
    if gpus is None:
        return []
    if isinstance(gpus, int):
        gpus = str(gpus)
    if isinstance(gpus, (list, tuple)):
        parts = [str(g).strip() for g in gpus]
    else:
        text = str(gpus).strip()
        if text in ("", "-1", "cpu", "none"):
            return []
        parts = [p.strip() for p in text.split(",")]
    ids = []
    for part in parts:
        try:
            ids.append(int(part))
        except ValueError:
            raise KwsError(
                f"--gpus {gpus}: {part!r} is not a GPU id; use comma-separated ids like 0,1 (-1 for CPU)"
            ) from None
    if ids == [-1]:
        return []
    negative = [i for i in ids if i < 0]
    if negative:
        raise KwsError(f"--gpus {gpus}: GPU ids must be >= 0 (got {negative[0]}); -1 alone means CPU")
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise KwsError(
            f"--gpus {gpus}: GPU {duplicates[0]} is listed twice; two ranks on one GPU fail in NCCL: list each GPU once"
        )
    return ids


def in_torchrun(environ):
    return bool(environ.get("TORCHELASTIC_RUN_ID") or environ.get("LOCAL_WORLD_SIZE"))


def _nproc(args, environ):
    """Processes per node: --nproc_per_node, else LOCAL_WORLD_SIZE, else WORLD_SIZE (one node)."""
    given = _get(args, "nproc_per_node")
    local = environ.get("LOCAL_WORLD_SIZE")
    world = environ.get("WORLD_SIZE")
    try:
        given = int(given) if given is not None else None
        local = int(local) if local else None
        world = int(world) if world else None
    except ValueError:
        raise KwsError(f"--nproc_per_node / LOCAL_WORLD_SIZE must be integers (got {given!r}, {local!r})") from None
    if given is not None and given < 1:
        raise KwsError(f"--nproc_per_node {given}: must be at least 1")
    if given is not None and local is not None and given != local:
        raise KwsError(
            f"--nproc_per_node {given} but torchrun started LOCAL_WORLD_SIZE={local} processes; make them equal"
        )
    for value in (given, local, world):
        if value is not None:
            return value
    return None


def _check_gpus(args, environ, report):
    gpus_arg = _get(args, "gpus")
    ids = parse_gpus(gpus_arg)
    nproc = _nproc(args, environ)
    report.gpus = ids
    if ids:
        if nproc is None:
            nproc = len(ids)
        elif len(ids) != nproc:
            where = (
                "LOCAL_WORLD_SIZE"
                if in_torchrun(environ) and _get(args, "nproc_per_node") is None
                else "--nproc_per_node"
            )
            raise KwsError(
                f"--gpus {gpus_arg} lists {len(ids)} GPU(s) but {where} is {nproc}: one process per "
                f"GPU, so make them equal (e.g. --nproc_per_node {len(ids)})"
            )
    report.nproc_per_node = nproc
    if nproc is not None:
        report.ok.append(f"processes per node: {nproc}")
    return ids


def cuda_indices(ids, environ):
    """The `cuda:<i>` index of each --gpus id. Ids index the visible devices, except that when
    CUDA_VISIBLE_DEVICES is set and lists every id, they are taken as the physical ids it names
    (WeKws style: `--gpus 4,5` with CUDA_VISIBLE_DEVICES=4,5 means cuda:0 and cuda:1)."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    physical = [p.strip() for p in cvd.split(",")] if cvd else []
    if ids and physical and all(str(gpu) in physical for gpu in ids):
        return [physical.index(str(gpu)) for gpu in ids]
    return list(ids)


def _check_visible(ids, environ, cuda, report):
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else "CUDA_VISIBLE_DEVICES unset"
    indices = cuda_indices(ids, environ)
    for gpu, index in zip(ids, indices):
        if index >= cuda.device_count:
            if cuda.device_count == 0:
                raise KwsError(
                    f"--gpus asks for GPU {gpu} but CUDA sees no GPU ({seen}); use --gpus -1 to train on "
                    f"CPU, or fix the driver / CUDA_VISIBLE_DEVICES"
                )
            raise KwsError(
                f"--gpus asks for GPU {gpu} but CUDA sees only {cuda.device_count} device(s), "
                f"0..{cuda.device_count - 1} ({seen}; --gpus ids index the visible devices); "
                f"use ids below {cuda.device_count}"
            )
    physical = [p.strip() for p in cvd.split(",")] if cvd else None
    for gpu, index in zip(ids, indices):
        name = cuda.names[index] if index < len(cuda.names) else "?"
        where = f" = physical {physical[index]}" if physical and index < len(physical) else ""
        label = f"GPU {gpu} (cuda:{index}{where})"
        free = cuda.free_bytes[index] if index < len(cuda.free_bytes) else None
        total = cuda.total_bytes[index] if index < len(cuda.total_bytes) else None
        if free is None or not total:
            report.ok.append(f"{label}: {name}, free memory not queried")
            continue
        report.ok.append(f"{label}: {name}, {free / GIB:.1f} GiB free of {total / GIB:.1f} GiB")
        if free < 0.5 * total:
            report.append(
                f"{label} has only {free / GIB:.1f} of {total / GIB:.1f} GiB free: "
                f"another job is using it (check nvidia-smi)"
            )


def choose_backend(requested, gpus, nccl_available, no_gpus="CUDA sees none", auto_needs_nccl=True):
    """The one rule for `--ddp.dist_backend`: auto -> nccl when the processes have GPUs (`gpus`) and this
    torch build has NCCL, gloo without GPUs. KwsError for an unknown name and for nccl without GPUs
    (`no_gpus` says why there are none) or without NCCL; with `auto_needs_nccl` also for auto with GPUs
    but no NCCL (else auto takes gloo then)."""
    requested = str(requested or "auto").lower()
    if requested not in BACKENDS:
        raise KwsError(f"--ddp.dist_backend {requested}: unknown backend; use one of {', '.join(BACKENDS)}")
    if requested == "auto":
        if gpus and not nccl_available and auto_needs_nccl:
            raise KwsError(
                "training on GPUs needs NCCL but this torch build has none; install a CUDA build "
                "of torch with NCCL or use --ddp.dist_backend gloo"
            )
        return "nccl" if gpus and nccl_available else "gloo"
    if requested == "nccl":
        if not gpus:
            raise KwsError(f"--ddp.dist_backend nccl needs GPUs but {no_gpus}; use gloo (or auto) to train on CPU")
        if not nccl_available:
            raise KwsError(
                "--ddp.dist_backend nccl but this torch build has no NCCL; use gloo, or a CUDA build of torch with NCCL"
            )
    return requested


def resolve_backend(requested, use_gpus, cuda):
    """auto -> nccl with GPUs (when NCCL is there), gloo without. KwsError for nccl without GPU/NCCL."""
    return choose_backend(
        requested,
        use_gpus and cuda.device_count > 0,
        cuda.nccl_available,
        "no --gpus were given" if cuda.device_count else "CUDA sees none",
    )


def _load_config(config):
    if config is None:
        return None, None
    if isinstance(config, dict):
        return config, "config"
    from kws.config import load_model_config

    return load_model_config(config), str(config)


def check_grad_clip(conf, source="config", report=None):
    """Warning text when training_config.grad_clip is absent (default 50 is used); KwsError when invalid."""
    training = conf.get("training_config") or {}
    clip = training.get("grad_clip") if isinstance(training, dict) else None
    if clip is None:
        text = (
            f"{source}: training_config.grad_clip is not set, so gradients are clipped at the default "
            f"{DEFAULT_GRAD_CLIP:g}; an unclipped or loose clip is the usual cause of NaN losses with many "
            f"GPUs: set training_config.grad_clip (WeKws ds_tcn uses 5)"
        )
        if report is not None:
            report.append(text)
        return text
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0:
        raise KwsError(f"{source}: training_config.grad_clip must be a positive number, got {clip!r}")
    if report is not None:
        report.ok.append(f"grad_clip: {clip:g}")
    return None


def available_cpus(threads=None):
    """CPUs this job may use: `threads` (e.g. Snakemake's --threads) when given, else the affinity mask."""
    if threads is not None:
        return int(threads)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_num_workers(num_workers, nproc, cpus, report):
    try:
        workers = int(num_workers)
    except (TypeError, ValueError):
        raise KwsError(f"--num_workers {num_workers!r}: must be a whole number") from None
    if workers < 0:
        raise KwsError(f"--num_workers {workers}: must be >= 0 (0 loads data in the training process)")
    nproc = nproc or 1
    needed = nproc * (workers + 1)
    if needed > cpus:
        suggest = max(0, cpus // nproc - 1)
        report.append(
            f"--num_workers {workers} with {nproc} process(es) needs {needed} CPUs "
            f"({nproc} x ({workers} workers + 1)) but the job has {cpus}: they will fight for CPUs; "
            f"use --num_workers {suggest} or give the job more CPUs"
        )
    else:
        report.ok.append(f"data loading: {nproc} x ({workers} workers + 1) = {needed} of {cpus} CPUs")


def run_preflight(
    args_like, environ=os.environ, cuda=None, cpus=None, check_port_free=None, choose_port=False, proc="/proc"
):
    """Run the checks on `args_like` (argparse Namespace or dict with any of: gpus, nproc_per_node, config
    (path or dict), num_workers, threads, master_addr, master_port, dist_backend / "ddp.dist_backend").

    - `cuda`: a CudaInfo (default: CudaInfo.query(), memory only for the requested GPUs; under torchrun only
      for this rank's GPU).
    - `cpus`: CPUs the job has (default: args.threads, else the affinity mask).
    - `check_port_free`: None = only outside torchrun (inside, the agent already holds the port).
    - `choose_port`: a taken port becomes a warning and `.master_port` holds a free one.

    Returns a PreflightReport (a list of warnings; `.ok` info lines). Raises KwsError on the first failure.
    """
    report = PreflightReport()
    ids = _check_gpus(args_like, environ, report)
    if cuda is None:
        if in_torchrun(environ):
            local = int(environ.get("LOCAL_RANK", "0") or 0)
            indices = cuda_indices(ids, environ)
            memory_for = {indices[local]} if local < len(indices) else {local}
        else:
            memory_for = set(cuda_indices(ids, environ))
        cuda = CudaInfo.query(memory_for=memory_for)
    _check_visible(ids, environ, cuda, report)

    requested = _get(args_like, "dist_backend", "ddp.dist_backend", "ddp_dist_backend", default="auto")
    use_gpus = bool(ids) or (
        _get(args_like, "gpus") is None and cuda.device_count > 0 and str(requested).lower() != "gloo"
    )
    report.backend = resolve_backend(requested, use_gpus, cuda)
    if report.backend == "nccl" and not ids:
        nproc = report.nproc_per_node or 1
        if nproc > cuda.device_count:
            raise KwsError(
                f"nccl with {nproc} process(es) per node but CUDA sees {cuda.device_count} GPU(s); "
                f"lower --nproc_per_node or pass --gpus"
            )
    if report.backend == "gloo" and ids:
        report.append(
            "--ddp.dist_backend gloo with GPUs: gradients go through host memory, much slower than "
            "nccl; use nccl (or auto)"
        )
    origin = f" (from {requested})" if str(requested).lower() == "auto" else ""
    report.ok.append(f"backend: {report.backend}" + origin)

    conf, source = _load_config(_get(args_like, "config"))
    if conf is not None:
        check_grad_clip(conf, source, report)

    if check_port_free is None:
        check_port_free = not in_torchrun(environ)
    port = _get(args_like, "master_port")
    if check_port_free and port is not None:
        host = str(_get(args_like, "master_addr", default=""))
        host = "" if host in ("", "localhost", "0.0.0.0", "::", "127.0.0.1") else host
        if host and not _is_local_address(host):
            report.ok.append(f"rendezvous port {port}: on {host}, not checked from here")
            report.master_port = int(port)
        else:
            chosen, warning = check_port(port, host, choose=choose_port, proc=proc)
            report.master_port = chosen
            if warning:
                report.append(warning)
            else:
                report.ok.append(f"rendezvous port {chosen}: free")

    if cpus is None:
        cpus = available_cpus(_get(args_like, "threads"))
    report.cpus = cpus
    workers = _get(args_like, "num_workers")
    if workers is not None:
        check_num_workers(workers, report.nproc_per_node, cpus, report)
    return report


def _is_local_address(host):
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    local = {"127.0.0.1", "::1"}
    try:
        local |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        pass
    return bool(addresses & local) or any(a.startswith("127.") for a in addresses)
