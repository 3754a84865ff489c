"""Resume or start over: a run's fingerprint, and the checkpoint a training continues from.

Two runs' checkpoints are interchangeable only when everything that shapes the model matches: the
config (but for max_epoch, which may grow, and the CMVN file's path), seed, world size, keyword
count, min_duration, the data (data lists and CMVN statistics by content), and the code that
trains (the digest of kws.trainer and every kws module it imports). A model folder
holding a different run's checkpoints is either refused or, with --restart_on_change (the workflow's
way), emptied so training starts from epoch 1.
"""

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kws import checkpoint as ckpt
from kws.config import apply_overrides
from kws.errors import KwsError
from kws.fileio import file_digest
from kws.sourcecode import code_digest, imported_files

log = logging.getLogger("kws.train")


def _digest(path):
    return None if path is None else file_digest(path, 16)


def trainer_code_digest():
    """Digest of the code that trains: kws.trainer and every kws module it imports. (scripts/train.py
    only calls kws.trainer.main, so the same run resumes whether started by the script or in-process.)"""
    trainer = Path(__file__).with_name("trainer.py")
    return code_digest([trainer, *imported_files(trainer)])


def comparable_config(config):
    """The parts of a config that must match to resume (max_epoch may grow, but not under the cosine
    learning-rate schedule, which it shapes: epochs trained towards another end are another run; the cmvn
    path may move)."""
    cosine = (config.get("training_config") or {}).get("lr_schedule") == "cosine"
    conf = apply_overrides(config, {} if cosine else {"training_config.max_epoch": None})
    conf.get("model", {}).get("cmvn", {}).pop("cmvn_file", None)
    return conf


def run_fingerprint(args, config, world_size, dictionary=None):
    """Everything that makes two runs' checkpoints interchangeable: resuming is allowed only on a match.
    `dictionary` (token -> keyword id, when the lists hold tokens): swapped ids are another run."""
    fingerprint = {
        "config": comparable_config(config),
        "seed": args.seed,
        "world_size": world_size,
        "num_keywords": args.num_keywords,
        "min_duration": args.min_duration,
        "train_data": _digest(args.train_data),
        "cv_data": _digest(args.cv_data),
        "cmvn": _digest(args.cmvn_file),
        "code": trainer_code_digest(),
    }
    if dictionary is not None:
        fingerprint["dictionary"] = dict(sorted(dictionary.items()))
    return fingerprint


def first_difference(a, b, prefix=""):
    """The first dotted key where two nested dicts differ (None when equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            diff = first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
            if diff:
                return diff
        return None
    return None if a == b else prefix.rstrip(".")


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


@dataclass
class ResumePoint:
    """Where a training starts: epoch 1, or after the checkpoint `path` (its payload loaded)."""

    path: str | None = None
    payload: dict = field(default_factory=dict)

    @property
    def start_epoch(self):
        return int(self.payload["epoch"]) + 1 if self.path else 1


def choose_checkpoint(args, model_dir, fingerprint, device):
    """Rank 0's choice: --checkpoint, else the newest complete checkpoint of this run in model_dir.

    A different run's checkpoints stop the run, or with --restart_on_change are deleted. Returns
    (path or None, its payload or None); the payload is kept so that rank 0 reads the file once.
    """
    if args.checkpoint is not None:
        return str(args.checkpoint), ckpt.load_payload(args.checkpoint, map_location=device)
    found = ckpt.find_resume_checkpoint(model_dir, map_location=device)
    if not found:
        return None, None
    _, path, payload = found
    if payload.get("fingerprint") != fingerprint:
        diff = first_difference(payload.get("fingerprint") or {}, fingerprint) or "fingerprint"
        if not args.restart_on_change:
            raise KwsError(
                f"{path}: checkpoint belongs to a different run ({diff} differs); use another "
                f"--model_dir, --restart_on_change to discard it, or --checkpoint to resume from it "
                f"anyway"
            )
        removed = discard_run(model_dir)
        log.warning(
            "%s differs from the checkpoints in %s: discarded %d files and training from scratch",
            diff,
            model_dir,
            len(removed),
        )
        return None, None
    return str(path), payload


def load_resume_point(path, payload, config, num_keywords, input_dim, world_size, device):
    """The checkpoint every rank resumes from, checked against this run (payload: rank 0's copy)."""
    if path is None:
        return ResumePoint()
    if payload is None:
        payload = ckpt.load_payload(path, map_location=device)
    for key, want in (("num_keywords", num_keywords), ("input_dim", input_dim)):
        if payload.get(key) != want:
            raise KwsError(
                f"{path}: checkpoint has {key} {payload.get(key)!r}, this run {want}; use another --model_dir"
            )
    if payload.get("config") is not None:
        diff = first_difference(comparable_config(payload["config"]), comparable_config(config))
        if diff:
            raise KwsError(
                f"{path}: checkpoint was trained with a different config ({diff}); "
                f"use another --model_dir or remove its checkpoints"
            )
    if payload.get("world_size") not in (None, world_size):
        log.warning(
            "%s was trained with %s processes, this run has %d: the result will differ from an uninterrupted run",
            path,
            payload.get("world_size"),
            world_size,
        )
    return ResumePoint(path, payload)
