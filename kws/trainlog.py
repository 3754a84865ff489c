"""What a training run records besides checkpoints: line logs, train_log.tsv, TensorBoard, run_info.yaml."""

import csv
import datetime
import io
import logging
import os
import platform
import socket
import sys
from pathlib import Path

import torch

from kws.fileio import atomic_open

log = logging.getLogger("kws.train")

TSV_COLUMNS = ["epoch", "train_loss", "cv_loss", "cv_acc", "lr", "grad_norm", "skipped_steps", "seconds", "utts_per_s"]


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
    writer = csv.DictWriter(buffer, fieldnames=TSV_COLUMNS, delimiter="\t", lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(
        {key: f"{value:.6g}" if isinstance(value, float) else value for key, value in row.items()} for row in rows
    )
    with atomic_open(path) as out:
        out.write(buffer.getvalue())


def open_writer(folder, purge_step=None):
    """TensorBoard writer. Every scalar is logged against the global step, so on resume `purge_step`
    (the step of the checkpoint) drops events a killed run wrote after it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard missing: train anyway, the TSV log has the same numbers
        log.warning("tensorboard is not installed: no TensorBoard logs")
        return None
    return SummaryWriter(str(folder), purge_step=purge_step)


def add_scalars(writer, prefix, values, step):
    if writer is not None:
        for name, value in values.items():
            writer.add_scalar(f"{prefix}/{name}", value, step)


def run_info(args, world_size, backend, device, threads, resume, max_epoch, parameters, train_utts, cv_utts):
    """run_info.yaml: who trained, where, with what, from where."""
    return {
        "seed": args.seed,
        "world_size": world_size,
        "backend": backend if world_size > 1 else None,
        "device": str(device) if device.type == "cpu" else f"cuda x {world_size}",
        "threads_per_process": threads,
        "num_workers": args.num_workers,
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "resumed_from": resume.path,
        "start_epoch": resume.start_epoch,
        "max_epoch": max_epoch,
        "parameters": parameters,
        "train_utterances": train_utts,
        "cv_utterances": cv_utts,
        "argv": [sys.executable, *sys.argv],
    }
