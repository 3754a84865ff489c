"""Training under torchrun (DDP), or as a single process without it. One readable loop, no framework.

    torchrun --standalone --nnodes 1 --nproc_per_node N scripts/train.py --config conf.yaml \
        --train_data train/data.list --cv_data dev/data.list --model_dir DIR --num_keywords 2 ...

Per epoch (epochs count from 1 to training_config.max_epoch):
1. every rank seeds python/numpy/torch from (seed, epoch, rank), so an epoch does the same thing
   whether the run was resumed or not (dropout masks included);
2. train: each rank reads its shard (kws.dataset). Ranks can have different numbers of batches, so
   every step all-reduces "I still have a batch"; when no rank has one the epoch ends, and a rank that
   has run out takes part in the step with a zero gradient (eval-mode forward, so its BatchNorm
   statistics do not move) while the others scale their loss by world_size / active_ranks: the
   averaged gradient is the mean over the ranks that had data. Every utterance is used exactly once;
3. the gradient is clipped to training_config.grad_clip (50 when absent, as WeKws); a step whose
   gradient norm is not finite is skipped (parameters and Adam state untouched) and counted;
   more than training_config.max_nonfinite_steps (default 20) in a row stops the run;
4. CV loss is all-reduced (sum of loss * utterances and of utterances), so every rank steps
   ReduceLROnPlateau on the same number;
5. rank 0 writes epoch_NNN.pt, then its sidecar epoch_NNN.yaml, train_log.tsv and TensorBoard scalars.

At start the newest complete checkpoint of model_dir (or --checkpoint) is resumed: model, Adam and
scheduler state, RNG state, step counters. With the same world size on CPU a resumed run ends
bit-identical to an uninterrupted one. At the end rank 0 writes model_dir/final.yaml (the workflow's
output). CUDA runs are reproducible only as far as cuDNN/NCCL are.
"""

import argparse
import csv
import datetime
import hashlib
import io
import logging
import math
import os
import platform
import random
import shutil
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import yaml

from kws import checkpoint as ckpt
from kws.cmvn import read_cmvn
from kws.config import apply_overrides, load_model_config, set_model_dims
from kws.dataset import KwsDataset, cv_dataset_conf, input_dim_of, make_loader
from kws.datalist import dictionary_arg, read_data_list
from kws.distributed import barrier_or_fail, cleanup, exit_with_launcher, init_distributed
from kws.errors import KwsError
from kws.fileio import atomic_open, ensure_dir
from kws.preflight import run_preflight

log = logging.getLogger("kws.train")

DEFAULT_GRAD_CLIP = 50.0
DEFAULT_MAX_NONFINITE = 20
DEFAULT_LOG_INTERVAL = 10
TSV_COLUMNS = ["epoch", "train_loss", "cv_loss", "cv_acc", "lr", "grad_norm", "skipped_steps", "seconds",
               "utts_per_s"]
SCHEDULER = {"mode": "min", "factor": 0.5, "patience": 3, "min_lr": 1e-6, "threshold": 0.01}


# -- command line ---------------------------------------------------------------------------------

def build_parser():
    p = argparse.ArgumentParser(description="Train a keyword-spotting model (WeKws-compatible arguments).")
    p.add_argument("--config", required=True, help="model config (WeKws layout)")
    p.add_argument("--train_data", required=True, help="training data.list")
    p.add_argument("--cv_data", required=True, help="cross-validation data.list")
    p.add_argument("--model_dir", required=True, help="output folder (checkpoints, logs)")
    p.add_argument("--gpus", default=None,
                   help="GPU ids, comma separated (WeKws); -1 = CPU. Default: the GPUs CUDA sees, else CPU. "
                        "When CUDA_VISIBLE_DEVICES is already set (kws.gpu), local rank r uses visible device r")
    p.add_argument("--seed", type=int, default=666, help="random seed (default 666)")
    p.add_argument("--checkpoint", default=None,
                   help="resume from this checkpoint (default: the newest complete one in model_dir)")
    p.add_argument("--tensorboard_dir", default=None, help="TensorBoard folder (default MODEL_DIR/tensorboard)")
    p.add_argument("--ddp.dist_backend", "--dist_backend", dest="dist_backend", default="auto",
                   choices=["auto", "nccl", "gloo"], help="auto: nccl on GPUs, gloo on CPU")
    p.add_argument("--timeout", "--ddp.timeout", "--dist_timeout", dest="timeout", type=float, default=1800,
                   help="process-group timeout in seconds (init and every collective)")
    p.add_argument("--num_workers", type=int, default=0, help="DataLoader workers per process")
    p.add_argument("--pin_memory", action="store_true", help="pinned host memory for batches")
    p.add_argument("--prefetch", type=int, default=2, help="batches prefetched per worker")
    p.add_argument("--train_feature_cache", default=None,
                   help="read training features from this kws.feature_cache folder (dither-0 fbank of "
                        "--train_data) instead of extracting them; the fbank dither is then not applied")
    p.add_argument("--cv_feature_cache", default=None,
                   help="read CV features from this kws.feature_cache folder (of --cv_data)")
    p.add_argument("--cmvn_file", default=None, help="global_cmvn JSON (WeKws)")
    p.add_argument("--norm_var", action="store_true", help="normalise variance too (else mean only)")
    p.add_argument("--num_keywords", type=int, default=1, help="number of keywords (model outputs)")
    p.add_argument("--dict", default=None,
                   help="keyword dictionary: WeKws's dict folder (dict.txt) or a words.txt with ids; maps data.list "
                        "tokens to keyword ids, needed for lists with tokens, checked against --num_keywords")
    p.add_argument("--min_duration", type=int, default=50, help="frames before which a keyword may not count")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="set a dotted config key, value parsed as YAML/JSON (repeatable)")
    p.add_argument("--max_epoch", type=int, default=None, help="override training_config.max_epoch")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU cores for the whole job; each process uses threads // processes-per-node "
                        "(default: $OMP_NUM_THREADS per process, else the cores available / processes)")
    p.add_argument("--restart_on_change", action="store_true",
                   help="when model_dir holds checkpoints of a different run (config, seed, data, world size), "
                        "delete them and train from scratch instead of stopping with an error (the workflow's way)")
    p.add_argument("--reverb_lmdb", default=None, help=argparse.SUPPRESS)
    p.add_argument("--noise_lmdb", default=None, help=argparse.SUPPRESS)
    return p


def parse_overrides(items):
    result = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise KwsError(f"--override {item!r}: expected KEY=VALUE, e.g. training_config.grad_clip=5")
        try:
            result[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise KwsError(f"--override {item!r}: value is not valid YAML/JSON") from None
    return result


# -- distributed set-up ---------------------------------------------------------------------------

def dist_env():
    """rank, local_rank, world_size, local_world_size from torchrun's environment (1 process without it)."""
    env = os.environ
    world_size = int(env.get("WORLD_SIZE", "1"))
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", str(rank)))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world_size)))
    return rank, local_rank, world_size, local_world


def choose_device(gpus, local_rank, local_world):
    """cpu, or cuda:<local_rank> among the visible devices (see --gpus)."""
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
            raise KwsError(f"--gpus {spec}: no CUDA device is available (use --gpus -1 for CPU)")
        return torch.device("cpu")
    if local_rank >= torch.cuda.device_count():
        raise KwsError(f"local rank {local_rank} has no GPU: only {torch.cuda.device_count()} visible "
                       f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    return torch.device("cuda", local_rank)


def choose_threads(threads, local_world):
    if threads is not None:
        if threads < 1:
            raise KwsError(f"--threads must be >= 1, got {threads}")
        return max(1, threads // max(1, local_world))
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world))


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed, epoch, rank):
    return int(np.random.SeedSequence([int(seed), int(epoch), int(rank)]).generate_state(1, np.uint64)[0] >> 1)


class Dist:
    """The few collectives the loop needs; no-ops for a single process."""

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
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


def make_optimizer(model, optim_conf, source):
    """Adam with optim_conf's settings; a mistyped value is a KwsError naming the key, not a TypeError."""
    optim_conf = dict(optim_conf or {})
    for key in ("lr", "weight_decay", "eps"):
        value = optim_conf.get(key)
        if isinstance(value, str):  # YAML 1.1 (PyYAML) reads `lr: 1e-3` as the string '1e-3'
            try:
                value = optim_conf[key] = float(value)
            except ValueError:
                pass
        if key in optim_conf and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise KwsError(f"{source}: optim_conf.{key} must be a number, got {value!r}")
    try:
        return torch.optim.Adam(model.parameters(), **optim_conf)
    except (TypeError, ValueError) as err:
        raise KwsError(f"{source}: optim_conf {optim_conf} is not valid for Adam ({err})") from None


# -- the steps ------------------------------------------------------------------------------------

def optimizer_step(model, optimizer, grad_clip):
    """Clip, then step unless the gradient norm is not finite. Returns (grad_norm float, stepped bool).

    The gradient is zeroed either way; a skipped step leaves parameters and optimizer state untouched.
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    grad_norm = float(grad_norm)
    stepped = math.isfinite(grad_norm)
    if stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, stepped


def idle_backward(model, input_dim, device):
    """A zero gradient from a rank without a batch, so DDP's gradient all-reduce still matches up."""
    was_training = model.training
    model.eval()  # BatchNorm statistics stay put, no dropout
    feats = torch.zeros(1, 8, input_dim, device=device)
    logits, _ = model(feats)
    (logits.sum() * 0.0).backward()
    model.train(was_training)


class NonFiniteGuard:
    """Counts skipped steps; raises KwsError after too many in a row."""

    def __init__(self, limit):
        self.limit = int(limit)
        self.in_a_row = 0
        self.total = 0

    def update(self, stepped, where):
        if stepped:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.total += 1
        log.warning("non-finite gradient norm at %s: step skipped (%d in a row, %d in total)",
                    where, self.in_a_row, self.total)
        if self.in_a_row > self.limit:
            raise KwsError(f"{self.in_a_row} steps in a row with a non-finite gradient (last at {where}); "
                           f"training diverged: lower optim_conf.lr or training_config.grad_clip, check the "
                           f"data and the CMVN file (limit: training_config.max_nonfinite_steps={self.limit})")


def train_one_epoch(run, epoch):
    """One pass over this rank's shard. Returns a dict of epoch statistics (identical on every rank)."""
    model, optimizer, loader = run.model, run.optimizer, run.train_loader
    model.train()
    run.train_set.set_epoch(epoch)
    loss_sum = acc_sum = utts = seen = 0.0
    norms = []
    skipped_before = run.guard.total
    batches = iter(loader)
    batch_index = 0
    while True:
        batch = next(batches, None)
        active = run.dist.sum([1.0 if batch is not None else 0.0])[0] if run.dist.enabled else float(batch is not None)
        if active == 0:
            break
        batch_index += 1
        run.step += 1
        loss_value = acc = float("nan")
        if batch is not None:
            keys, feats, lengths, targets = batch
            feats, lengths, targets = (t.to(run.device, non_blocking=True) for t in (feats, lengths, targets))
            logits, _ = model(feats)
            loss, acc = run.criterion(logits, lengths, targets, run.min_duration)
            scale = run.dist.world_size / active
            (loss * scale if scale != 1 else loss).backward()
            loss_value = loss.item()
            seen += len(keys)
            if math.isfinite(loss_value):
                loss_sum += loss_value * len(keys)
                acc_sum += acc * len(keys)
                utts += len(keys)
        else:
            idle_backward(model, run.input_dim, run.device)
        grad_norm, stepped = optimizer_step(model, optimizer, run.grad_clip)
        run.guard.update(stepped, f"epoch {epoch} batch {batch_index}")
        if stepped:
            norms.append(grad_norm)
        if batch_index % run.log_interval == 0 and run.rank == 0:
            lr = optimizer.param_groups[0]["lr"]
            log.info("epoch %d batch %d loss %.4f acc %.3f grad_norm %.4f lr %.3g", epoch, batch_index,
                     loss_value, acc, grad_norm, lr)
            if run.writer is not None:
                run.writer.add_scalar("train/loss", loss_value, run.step)
                run.writer.add_scalar("train/grad_norm", grad_norm, run.step)
                run.writer.add_scalar("train/lr", lr, run.step)
    loss_sum, acc_sum, utts, seen = run.dist.sum([loss_sum, acc_sum, utts, seen])
    return {
        "train_loss": loss_sum / utts if utts else float("nan"),
        "train_acc": acc_sum / utts if utts else float("nan"),
        "train_utts": int(seen),
        "batches": batch_index,
        "grad_norm": float(np.mean(norms)) if norms else float("nan"),
        "skipped_steps": run.guard.total - skipped_before,
    }


def evaluate(run):
    """CV loss and accuracy over the whole CV list (each rank its shard), all-reduced."""
    model = run.bare_model
    run.dist.sync_buffers(model)
    model.eval()
    loss_sum = acc_sum = utts = 0.0
    with torch.no_grad():
        for keys, feats, lengths, targets in run.cv_loader:
            feats, lengths, targets = (t.to(run.device, non_blocking=True) for t in (feats, lengths, targets))
            logits, _ = model(feats)
            loss, acc = run.criterion(logits, lengths, targets, run.min_duration)
            loss_sum += float(loss) * len(keys)
            acc_sum += acc * len(keys)
            utts += len(keys)
    loss_sum, acc_sum, utts = run.dist.sum([loss_sum, acc_sum, utts])
    if utts == 0:
        raise KwsError(f"{run.args.cv_data}: no utterance passed dataset_conf.filter_conf")
    return loss_sum / utts, acc_sum / utts


# -- logs -----------------------------------------------------------------------------------------

def read_tsv(path, before_epoch):
    """Rows of an existing train_log.tsv for epochs < before_epoch (kept on resume)."""
    path = Path(path)
    if not path.is_file():
        return []
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    kept = []
    for row in rows:
        try:
            if int(row["epoch"]) < before_epoch:
                kept.append(row)
        except (KeyError, TypeError, ValueError):
            continue
    return kept


def write_tsv(path, rows):
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=TSV_COLUMNS, delimiter="\t", lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    with atomic_open(path) as out:
        out.write(buffer.getvalue())


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def open_writer(folder, purge_step=None):
    """TensorBoard writer. Every scalar is logged against the global step, so on resume `purge_step`
    (the step of the checkpoint) drops events a killed run wrote after it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard missing: train anyway, the TSV log has the same numbers
        log.warning("tensorboard is not installed: no TensorBoard logs")
        return None
    return SummaryWriter(str(folder), purge_step=purge_step)


# -- config ---------------------------------------------------------------------------------------

def resolve_config(args):
    overrides = parse_overrides(args.override)
    if args.max_epoch is not None:
        overrides["training_config.max_epoch"] = args.max_epoch
    config = load_model_config(args.config, overrides)
    tc = config["training_config"]
    if tc.get("grad_clip") is None:
        log.warning("%s: training_config.grad_clip not set; clipping gradients at %s (WeKws default)",
                    args.config, DEFAULT_GRAD_CLIP)
        tc["grad_clip"] = DEFAULT_GRAD_CLIP
    tc.setdefault("max_epoch", 100)
    tc.setdefault("log_interval", DEFAULT_LOG_INTERVAL)
    tc.setdefault("criterion", "max_pooling")
    tc.setdefault("max_nonfinite_steps", DEFAULT_MAX_NONFINITE)
    tc["min_duration"] = args.min_duration
    for key in ("max_epoch", "log_interval"):
        if isinstance(tc[key], bool) or not isinstance(tc[key], int) or tc[key] < 1:
            raise KwsError(f"{args.config}: training_config.{key} must be a positive integer, got {tc[key]!r}")
    if not isinstance(tc["grad_clip"], (int, float)) or not tc["grad_clip"] > 0:
        raise KwsError(f"{args.config}: training_config.grad_clip must be a positive number, got {tc['grad_clip']!r}")
    optim = str(config.get("optim", "adam")).lower()
    if optim != "adam":
        raise KwsError(f"{args.config}: optim {config.get('optim')!r} is not supported (adam)")
    config["optim"] = "adam"
    config.setdefault("optim_conf", {"lr": 0.001})
    if args.cmvn_file is not None:  # recorded as WeKws does; the statistics themselves are model buffers
        config["model"]["cmvn"] = {"norm_var": bool(args.norm_var), "cmvn_file": str(args.cmvn_file)}
    return set_model_dims(config, args.num_keywords, args.config)


def _comparable(config):
    """The parts of a config that must match to resume (max_epoch may grow; the cmvn path may move)."""
    conf = apply_overrides(config, {"training_config.max_epoch": None})
    conf.get("model", {}).get("cmvn", {}).pop("cmvn_file", None)
    return conf


def _file_digest(path):
    if path is None:
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def run_fingerprint(args, config, world_size):
    """Everything that makes two runs' checkpoints interchangeable: resuming is allowed only on a match.

    The data enters by content (data lists and CMVN statistics), so a regenerated corpus is never
    resumed into, even when its paths stay the same.
    """
    fingerprint = {
        "config": _comparable(config),
        "seed": args.seed,
        "world_size": world_size,
        "num_workers": args.num_workers,
        "num_keywords": args.num_keywords,
        "min_duration": args.min_duration,
        "train_data": _file_digest(args.train_data),
        "cv_data": _file_digest(args.cv_data),
        "cmvn": _file_digest(args.cmvn_file),
    }
    if getattr(args, "train_feature_cache", None):
        fingerprint["feature_cache"] = True  # no dither: a different run (key absent otherwise, as before)
    return fingerprint


def discard_run(model_dir):
    """Delete the checkpoints and logs of an earlier, different run (the workflow asked for a fresh one)."""
    stale = [path for _, sidecar, pt in ckpt.completed_epochs(model_dir) for path in (sidecar, pt)]
    stale += [model_dir / name for name in ("final.yaml", "train_log.tsv")]
    stale += list(model_dir.glob("epoch_*.pt"))
    removed = sorted({str(path) for path in stale if path.exists()})
    for path in removed:
        Path(path).unlink()
    shutil.rmtree(model_dir / "tensorboard", ignore_errors=True)
    return removed


def _first_difference(a, b, prefix=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            diff = _first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
            if diff:
                return diff
        return None
    return None if a == b else prefix.rstrip(".")


# -- the run --------------------------------------------------------------------------------------

class Run:
    """Everything the loop needs, in one place."""


def setup_logging(rank):
    """Line logs on stdout: INFO from rank 0, warnings and errors from every rank."""
    logger = logging.getLogger("kws")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    if not any(getattr(h, "_kws_train", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler._kws_train = True
        logger.addHandler(handler)
    for handler in logger.handlers:
        if getattr(handler, "_kws_train", False):
            handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s"))


def train(args):
    rank, local_rank, world_size, local_world = dist_env()
    exit_with_launcher()  # no orphaned workers when torchrun (or Snakemake) is killed
    setup_logging(rank)
    if args.reverb_lmdb or args.noise_lmdb:
        raise KwsError("--reverb_lmdb/--noise_lmdb are not supported: augment the corpus instead")
    config = resolve_config(args)
    tc = config["training_config"]
    model_dir = Path(args.model_dir)
    if rank == 0:
        ensure_dir(model_dir)

    threads = choose_threads(args.threads, local_world)
    torch.set_num_threads(threads)
    device = choose_device(args.gpus, local_rank, local_world)
    backend = args.dist_backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise KwsError("--ddp.dist_backend nccl needs GPUs; this process has none (use gloo or auto)")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if rank == 0:
        # The multi-GPU checklist, before a GPU hour is spent: ids vs processes, visibility, NCCL, clip, workers.
        report = run_preflight({"gpus": args.gpus, "nproc_per_node": local_world, "config": config,
                                "num_workers": args.num_workers, "threads": args.threads,
                                "dist_backend": backend})
        for line in report.ok:
            log.info("preflight: %s", line)
        for line in report:
            log.warning("preflight: %s", line)
    if world_size > 1:
        # Every rank checks in first: a rank that never arrives is named within the timeout, no hang.
        init_distributed(backend, timeout_s=args.timeout)
    try:
        return _train(args, config, tc, model_dir, rank, world_size, device, backend, threads)
    finally:
        cleanup()


def _train(args, config, tc, model_dir, rank, world_size, device, backend, threads):
    from kws.loss import criterion
    from kws.model import build_model, count_parameters, receptive_field

    run = Run()
    run.args, run.rank, run.device = args, rank, device
    run.dist = Dist(world_size, device, backend)
    run.input_dim = input_dim_of(config["dataset_conf"])
    run.min_duration = args.min_duration
    run.grad_clip = float(tc["grad_clip"])
    run.log_interval = int(tc["log_interval"])
    run.criterion = criterion(tc["criterion"])
    run.guard = NonFiniteGuard(tc["max_nonfinite_steps"])
    max_epoch = int(tc["max_epoch"])

    # Data first: a bad list fails before anything is written.
    dictionary = dictionary_arg(args.dict, args.num_keywords)
    train_items = read_data_list(args.train_data, args.num_keywords, dictionary)
    cv_items = read_data_list(args.cv_data, args.num_keywords, dictionary)
    run.train_set = KwsDataset(args.train_data, config["dataset_conf"], seed=args.seed, rank=rank,
                               world_size=world_size, items=train_items, feature_cache=args.train_feature_cache)
    cv_set = KwsDataset(args.cv_data, cv_dataset_conf(config["dataset_conf"]), seed=args.seed, rank=rank,
                        world_size=world_size, items=cv_items, feature_cache=args.cv_feature_cache)
    if args.train_feature_cache and rank == 0 and float(run.train_set.fbank_conf.get("dither", 0)) > 0:
        log.info("training features from the cache %s: fbank dither %g is not applied (cached with dither 0)",
                 args.train_feature_cache, float(run.train_set.fbank_conf["dither"]))
    pin = args.pin_memory and device.type == "cuda"
    run.train_loader = make_loader(run.train_set, args.num_workers, pin, args.prefetch)
    run.cv_loader = make_loader(cv_set, args.num_workers, pin, args.prefetch)

    cmvn = read_cmvn(args.cmvn_file) if args.cmvn_file is not None else None
    if cmvn is not None and len(cmvn["mean_stat"]) != run.input_dim:
        raise KwsError(f"{args.cmvn_file}: statistics are {len(cmvn['mean_stat'])}-dimensional but the features "
                       f"are {run.input_dim}-dimensional (dataset_conf.fbank_conf.num_mel_bins of {args.config}); "
                       f"recompute the CMVN file")

    seed_everything(args.seed)
    model = build_model(config["model"], run.input_dim, args.num_keywords, cmvn)
    if cmvn is not None and not args.norm_var:
        with torch.no_grad():
            model.global_cmvn.istd.fill_(1.0)  # WeKws without --norm_var: subtract the mean only
    model.to(device)
    optimizer = make_optimizer(model, config.get("optim_conf"), args.config)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **SCHEDULER)

    # Resume: rank 0 picks the checkpoint, every rank loads that one. Only a checkpoint of the same
    # run (fingerprint) is resumed; an explicit --checkpoint is the user's deliberate choice.
    fingerprint = run_fingerprint(args, config, world_size)
    start_epoch, run.step, history, resumed_from = 1, 0, [], None
    payload = None  # rank 0 keeps the checkpoint it read while choosing, instead of reading it again
    if rank == 0:
        if args.checkpoint is not None:
            chosen = str(args.checkpoint)
            payload = ckpt.load_payload(chosen, map_location=device)  # fails here, clearly, if unreadable
        else:
            found = ckpt.find_resume_checkpoint(model_dir, map_location=device)
            chosen = str(found[1]) if found else None
            payload = found[2] if found else None
            if found and found[2].get("fingerprint") != fingerprint:
                diff = _first_difference(found[2].get("fingerprint") or {}, fingerprint) or "fingerprint"
                if not args.restart_on_change:
                    raise KwsError(f"{chosen}: checkpoint belongs to a different run ({diff} differs); "
                                   f"use another --model_dir, --restart_on_change to discard it, or "
                                   f"--checkpoint to resume from it anyway")
                removed = discard_run(model_dir)
                log.warning("%s differs from the checkpoints in %s: discarded %d files and training from "
                            "scratch", diff, model_dir, len(removed))
                chosen = payload = None
    else:
        chosen = None
    chosen = run.dist.broadcast(chosen)
    if chosen is not None:
        if payload is None:
            payload = ckpt.load_payload(chosen, map_location=device)
        for key, want in (("num_keywords", args.num_keywords), ("input_dim", run.input_dim)):
            if payload.get(key) != want:
                raise KwsError(f"{chosen}: checkpoint has {key} {payload.get(key)!r}, this run {want}; "
                               f"use another --model_dir")
        if payload.get("config") is not None:
            diff = _first_difference(_comparable(payload["config"]), _comparable(config))
            if diff:
                raise KwsError(f"{chosen}: checkpoint was trained with a different config ({diff}); "
                               f"use another --model_dir or remove its checkpoints")
        model.load_state_dict(payload["model"])
        if payload.get("optimizer"):
            optimizer.load_state_dict(payload["optimizer"])
        if payload.get("scheduler"):
            scheduler.load_state_dict(payload["scheduler"])
        ckpt.set_rng_state(payload.get("rng"))
        start_epoch = int(payload["epoch"]) + 1
        run.step = int(payload.get("step", 0))
        run.guard.total = int(payload.get("skipped_steps_total", 0))
        resumed_from = str(chosen)
        if payload.get("world_size") not in (None, world_size):
            log.warning("%s was trained with %s processes, this run has %d: the result will differ from an "
                        "uninterrupted run", chosen, payload.get("world_size"), world_size)
        log.info("resuming from %s: epoch %d of %d", chosen, start_epoch, max_epoch)
        del payload
    run.bare_model = model
    run.model = model
    if world_size > 1:
        run.model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    run.optimizer = optimizer

    run.writer = None
    tsv_path = model_dir / "train_log.tsv"
    final_path = model_dir / "final.yaml"
    if rank == 0:
        if start_epoch <= max_epoch and final_path.exists():
            final_path.unlink()  # more epochs to train: the old completion marker no longer holds
        ckpt.write_yaml(model_dir / "config.yaml", config)
        ckpt.write_yaml(model_dir / "run_info.yaml", {
            "seed": args.seed, "world_size": world_size, "backend": backend if world_size > 1 else None,
            "device": str(device) if device.type == "cpu" else f"cuda x {world_size}",
            "threads_per_process": threads, "num_workers": args.num_workers,
            "torch": str(torch.__version__), "python": platform.python_version(), "host": socket.gethostname(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "started": datetime.datetime.now().isoformat(timespec="seconds"), "resumed_from": resumed_from,
            "start_epoch": start_epoch, "max_epoch": max_epoch, "parameters": count_parameters(model),
            "train_utterances": len(train_items), "cv_utterances": len(cv_items),
            "argv": [sys.executable, *sys.argv],
        })
        history = read_tsv(tsv_path, start_epoch)
        run.writer = open_writer(Path(args.tensorboard_dir) if args.tensorboard_dir else model_dir / "tensorboard",
                                 purge_step=run.step + 1 if resumed_from else None)
        log.info("model: %d parameters; %d train / %d cv utterances; %d process(es) on %s (%s), %d thread(s) each",
                 count_parameters(model), len(train_items), len(cv_items), world_size, device.type,
                 backend if world_size > 1 else "no DDP", threads)
        frames = receptive_field(model)
        if frames is not None:
            shift_ms = float(run.train_set.fbank_conf.get("frame_shift", 10))
            log.info("receptive field: %d frames (%.2f s); a longer keyword is only ever seen in part",
                     frames, frames * shift_ms / 1000)

    for epoch in range(start_epoch, max_epoch + 1):
        seed_everything(epoch_seed(args.seed, epoch, rank))
        lr = optimizer.param_groups[0]["lr"]
        started = time.monotonic()
        stats = train_one_epoch(run, epoch)
        cv_loss, cv_acc = evaluate(run)
        scheduler.step(cv_loss)
        seconds = time.monotonic() - started
        if rank == 0:
            row = {"epoch": epoch, "train_loss": stats["train_loss"], "cv_loss": cv_loss, "cv_acc": cv_acc, "lr": lr,
                   "grad_norm": stats["grad_norm"], "skipped_steps": stats["skipped_steps"],
                   "seconds": round(seconds, 3), "utts_per_s": round(stats["train_utts"] / max(seconds, 1e-9), 2)}
            payload = {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": epoch, "step": run.step, "cv_loss": cv_loss,
                "cv_acc": cv_acc, "train_loss": stats["train_loss"], "lr": lr,
                "skipped_steps_total": run.guard.total, "rng": ckpt.rng_state(), "config": config,
                "num_keywords": args.num_keywords, "input_dim": run.input_dim, "seed": args.seed,
                "world_size": world_size, "fingerprint": fingerprint,
            }
            ckpt.save_checkpoint(model_dir, payload, {
                "cv_loss": cv_loss, "cv_acc": cv_acc, "train_loss": stats["train_loss"], "lr": lr,
                "grad_norm": stats["grad_norm"], "skipped_steps": stats["skipped_steps"],
                "train_utterances": stats["train_utts"], "batches": stats["batches"], "seconds": round(seconds, 3),
            })
            history.append({key: _fmt(value) for key, value in row.items()})
            write_tsv(tsv_path, history)
            if run.writer is not None:
                for name in ("train_loss", "cv_loss", "cv_acc", "lr", "grad_norm", "skipped_steps", "utts_per_s"):
                    run.writer.add_scalar(f"epoch/{name}", row[name], run.step)
                run.writer.flush()
            log.info("epoch %d: train_loss %.4f cv_loss %.4f cv_acc %.3f lr %.3g grad_norm %.3f skipped %d "
                     "(%.1f s, %.1f utt/s, %d batches)", epoch, stats["train_loss"], cv_loss, cv_acc, lr,
                     stats["grad_norm"], stats["skipped_steps"], seconds, row["utts_per_s"], stats["batches"])
        run.dist.barrier(f"the end of epoch {epoch}", args.timeout)  # nobody runs ahead of a checkpoint

    if rank == 0:
        epochs = [epoch for epoch, _, _ in ckpt.completed_epochs(model_dir) if epoch <= max_epoch]
        ckpt.write_yaml(final_path, {
            "max_epoch": max_epoch, "epochs": epochs,
            "last_checkpoint": ckpt.checkpoint_name(max_epoch),
            "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        })
        if run.writer is not None:
            run.writer.close()
        log.info("training finished: %s", final_path)
    return 0


def main(argv=None):
    return train(build_parser().parse_args(argv))
