"""Training under torchrun (DDP), or as a single process without it.

    torchrun --standalone --nnodes 1 --nproc_per_node N scripts/train.py --config conf.yaml \
        --train_data train/data.list --cv_data dev/data.list --model_dir DIR --num_keywords 2 ...

`_train` reads data -> model -> resume point -> loop. Per epoch (epochs count from 1 to
training_config.max_epoch):
1. every rank seeds python/numpy/torch from (seed, epoch, rank), so an epoch does the same thing
   whether the run was resumed or not (dropout masks included); nothing else carries randomness from
   one epoch to the next (the data pipeline seeds its own generators from seed and epoch);
2. train: each rank reads its shard (kws.dataset). Ranks can have different numbers of batches; every
   rank knows every rank's count in advance (kws.dataset plans them), so no collective asks who still
   has one. A rank that has run out takes part in the step with a zero gradient (eval-mode forward, so
   its BatchNorm statistics do not move) while the others scale their loss by world_size / active_ranks:
   the averaged gradient is the mean over the ranks that had data. Every utterance is used exactly once;
3. the gradient is clipped to training_config.grad_clip (kws.preflight.DEFAULT_GRAD_CLIP, WeKws's 50,
   when absent); a step whose gradient norm is not finite is skipped (parameters and Adam state
   untouched; inside fused Adam, so the host never waits for the norm) and counted; more than
   training_config.max_nonfinite_steps (default 20) in a row stops the run (checked at each log
   interval: nothing is read back from the device between them);
4. CV loss is all-reduced (sum of loss * utterances and of utterances), so every rank steps
   ReduceLROnPlateau on the same number;
5. rank 0 writes epoch_NNN.pt, then its sidecar epoch_NNN.yaml, train_log.tsv and TensorBoard scalars.

At start the newest complete checkpoint of this run in model_dir (or --checkpoint) is resumed
(kws.resume: model, Adam and scheduler state, step counters). With the same world size on CPU a
resumed run ends bit-identical to an uninterrupted one. At the end rank 0 writes model_dir/final.yaml
(the workflow's output). CUDA runs are reproducible only as far as cuDNN/NCCL are.
"""

import argparse
import datetime
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kws import checkpoint as ckpt
from kws.adversary import EngineAdversaryModel, engine_loss, engine_targets, engine_vocabulary
from kws.audio_store import open_or_build
from kws.cmvn import read_cmvn
from kws.config import load_model_config, parse_overrides, set_model_dims
from kws.datalist import CONFUSABLE_KINDS, dictionary_arg, read_data_list
from kws.dataset import Featurizer, KwsDataset, cv_dataset_conf, input_dim_of, keyword_end_frames
from kws.device import to_device
from kws.distributed import (
    Dist,
    choose_device,
    choose_threads,
    cleanup,
    dist_env,
    exit_with_launcher,
    init_distributed,
    resolve_backend,
)
from kws.ema import DEFAULT_WARMUP, WeightAverage
from kws.errors import KwsError
from kws.features import fbank_conf_of
from kws.fileio import ensure_dir
from kws.loss import prefix_negative_loss
from kws.mel_warp import parse_conf as parse_mel_warp
from kws.model.batch_norm import real_frames, use_real_frames
from kws.phones import PhoneCTCModel, keyword_phones, phone_ctc_loss, phone_targets, phone_vocabulary
from kws.preflight import BACKENDS, DEFAULT_GRAD_CLIP, run_preflight
from kws.resume import choose_checkpoint, load_resume_point, run_fingerprint
from kws.trainlog import add_scalars, open_writer, read_tsv, run_info, setup_logging, write_tsv

log = logging.getLogger("kws.train")

DEFAULT_MAX_NONFINITE = 20
DEFAULT_LOG_INTERVAL = 10
# training_config.precision -> the autocast dtype of the forward (None: fp32 throughout); `auto` is bf16 on
# a CPU with native bf16 (AVX512-BF16 / AMX: 1.2x the epochs of fp32 here, same accuracy within seeds,
# bench/results.md) and fp32 elsewhere, GPUs included (not measured there yet). Parameters,
# gradients, Adam state and the loss stay fp32; scoring and export run fp32.
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
SCHEDULER = {"mode": "min", "factor": 0.5, "patience": 3, "min_lr": 1e-6, "threshold": 0.01}
LR_SCHEDULES = ("plateau", "cosine")  # training_config.lr_schedule: WeKws's ReduceLROnPlateau, or per step
COSINE_FLOOR = 0.02  # the cosine schedule's last learning rate, as a fraction of optim_conf.lr


# -- command line and config ----------------------------------------------------------------------


def build_parser():
    p = argparse.ArgumentParser(description="Train a keyword-spotting model (WeKws-compatible arguments).")
    p.add_argument("--config", required=True, help="model config (WeKws layout)")
    p.add_argument("--train_data", required=True, help="training data.list")
    p.add_argument("--cv_data", required=True, help="cross-validation data.list")
    p.add_argument("--model_dir", required=True, help="output folder (checkpoints, logs)")
    p.add_argument(
        "--gpus",
        default=None,
        help="GPU ids, comma separated (WeKws); -1 = CPU. Default: the GPUs CUDA sees, else CPU. "
        "When CUDA_VISIBLE_DEVICES is already set (kws.gpu), local rank r uses visible device r",
    )
    p.add_argument("--seed", type=int, default=666, help="random seed (default 666)")
    p.add_argument(
        "--checkpoint", default=None, help="resume from this checkpoint (default: the newest complete one in model_dir)"
    )
    p.add_argument("--tensorboard_dir", default=None, help="TensorBoard folder (default MODEL_DIR/tensorboard)")
    p.add_argument(
        "--ddp.dist_backend",
        "--dist_backend",
        dest="dist_backend",
        default="auto",
        choices=BACKENDS,
        help="auto: nccl on GPUs, gloo on CPU",
    )
    p.add_argument(
        "--timeout",
        "--ddp.timeout",
        "--dist_timeout",
        dest="timeout",
        type=float,
        default=1800,
        help="process-group timeout in seconds (init and every collective)",
    )
    p.add_argument(
        "--num_workers",
        type=int,
        default=0,
        help="accepted for WeKws's command line; unused: batches are slices of the audio store, "
        "featurised on the training device",
    )
    p.add_argument(
        "--pin_memory", action="store_true", help="accepted (WeKws); batches always reach a GPU through pinned memory"
    )
    p.add_argument("--prefetch", type=int, default=2, help=argparse.SUPPRESS)  # WeKws's; unused
    p.add_argument(
        "--train_audio_store",
        default=None,
        help="audio store of --train_data (scripts/pack_audio.py); default: packed into "
        "MODEL_DIR/audio/train on first use",
    )
    p.add_argument("--cv_audio_store", default=None, help="audio store of --cv_data (default: MODEL_DIR/audio/cv)")
    p.add_argument("--cmvn_file", default=None, help="global_cmvn JSON (WeKws)")
    p.add_argument("--norm_var", action="store_true", help="normalise variance too (else mean only)")
    p.add_argument("--num_keywords", type=int, default=1, help="number of keywords (model outputs)")
    p.add_argument(
        "--dict",
        default=None,
        help="keyword dictionary: WeKws's dict folder (dict.txt) or a words.txt with ids; maps data.list "
        "tokens to keyword ids, needed for lists with tokens, checked against --num_keywords",
    )
    p.add_argument("--min_duration", type=int, default=50, help="frames before which a keyword may not count")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a dotted config key, value parsed as YAML/JSON (repeatable)",
    )
    p.add_argument("--max_epoch", type=int, default=None, help="override training_config.max_epoch")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU cores for the whole job; each process uses threads // processes-per-node "
        "(default: $OMP_NUM_THREADS per process, else the cores available / processes)",
    )
    p.add_argument(
        "--restart_on_change",
        action="store_true",
        help="when model_dir holds checkpoints of a different run (config, seed, data, world size), "
        "delete them and train from scratch instead of stopping with an error (the workflow's way)",
    )
    p.add_argument("--reverb_lmdb", default=None, help=argparse.SUPPRESS)
    p.add_argument("--noise_lmdb", default=None, help=argparse.SUPPRESS)
    return p


def resolve_config(args):
    """The model config with --override and --max_epoch applied, training defaults filled and checked."""
    overrides = parse_overrides(args.override)
    if args.max_epoch is not None:
        overrides["training_config.max_epoch"] = args.max_epoch
    config = load_model_config(args.config, overrides)
    tc = config["training_config"]
    if tc.get("grad_clip") is None:
        log.warning(
            "%s: training_config.grad_clip not set; clipping gradients at %s (WeKws default)",
            args.config,
            DEFAULT_GRAD_CLIP,
        )
        tc["grad_clip"] = DEFAULT_GRAD_CLIP
    tc.setdefault("max_epoch", 100)
    tc.setdefault("log_interval", DEFAULT_LOG_INTERVAL)
    tc.setdefault("criterion", "max_pooling")
    tc.setdefault("max_nonfinite_steps", DEFAULT_MAX_NONFINITE)
    tc.setdefault("precision", "fp32")
    if tc["precision"] not in (*PRECISIONS, "auto"):
        raise KwsError(
            f"{args.config}: training_config.precision must be one of fp32, bf16, auto, got {tc['precision']!r}"
        )
    tc.setdefault("lr_schedule", "plateau")
    if tc["lr_schedule"] not in LR_SCHEDULES:
        raise KwsError(
            f"{args.config}: training_config.lr_schedule must be one of {', '.join(LR_SCHEDULES)}, "
            f"got {tc['lr_schedule']!r}"
        )
    tc["min_duration"] = args.min_duration
    for key in ("end_anchor", "prefix_negatives"):
        frames = tc.get(key)
        if frames is not None and (isinstance(frames, bool) or not isinstance(frames, int) or frames < 0):
            raise KwsError(
                f"{args.config}: training_config.{key} must be a number of frames >= 0 or null, got {frames!r}"
            )
    for key in ("phone_ctc", "confusable_weight", "engine_adversary"):
        weight = tc.get(key)
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0):
            raise KwsError(f"{args.config}: training_config.{key} must be a weight >= 0 or null, got {weight!r}")
    real_only = tc.get("bn_real_frames", False)
    if not isinstance(real_only, bool):
        raise KwsError(f"{args.config}: training_config.bn_real_frames must be true or false, got {real_only!r}")
    decay = tc.get("ema_decay")
    if decay is not None and (isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay < 1):
        raise KwsError(f"{args.config}: training_config.ema_decay must be a number in (0, 1) or null, got {decay!r}")
    warmup = tc.get("ema_warmup", DEFAULT_WARMUP)
    if isinstance(warmup, bool) or not isinstance(warmup, (int, float)) or not warmup >= 2:
        raise KwsError(f"{args.config}: training_config.ema_warmup must be a number >= 2, got {warmup!r}")
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


def native_bf16(device):
    """Whether `device` is a CPU that computes bf16 natively (oneDNN's own check)."""
    return device.type == "cpu" and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_precision(precision, device, source):
    """training_config.precision on `device`: `auto` resolved (the resolved value is what the model
    directory's config.yaml and the resume fingerprint record)."""
    native = native_bf16(device)
    if precision == "auto":
        precision = "bf16" if native else "fp32"
        log.info("training_config.precision auto -> %s on %s", precision, device)
    elif precision == "bf16" and device.type == "cpu" and not native:
        log.warning("%s: training_config.precision bf16, but this CPU has no native bf16: slower than fp32", source)
    return precision


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
    # fused: one kernel over all parameters (0.24 ms a step for the default model against 1.35 ms for the
    # per-tensor loop, which torch still picks on CPU); optim_conf's foreach or fused wins
    settings = optim_conf if {"fused", "foreach"} & set(optim_conf) else {"fused": True, **optim_conf}
    try:
        return torch.optim.Adam(model.parameters(), **settings)
    except (TypeError, ValueError) as err:
        raise KwsError(f"{source}: optim_conf {optim_conf} is not valid for Adam ({err})") from None


def cosine_lr(base_lr, progress):
    """training_config.lr_schedule cosine: base_lr at progress 0 (the first step), down half a cosine to
    COSINE_FLOOR x base_lr at 1 (the end of the last epoch). A function of the step's place in the run
    alone, so a resumed run takes the very learning rates of an uninterrupted one."""
    floor = COSINE_FLOOR * base_lr
    return floor + (base_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed, epoch, rank):
    return int(np.random.SeedSequence([int(seed), int(epoch), int(rank)]).generate_state(1, np.uint64)[0] >> 1)


# -- the steps ------------------------------------------------------------------------------------


class NonFiniteGuard:
    """Counts skipped steps; raises KwsError after too many in a row."""

    def __init__(self, limit, total=0):
        self.limit = int(limit)
        self.in_a_row = 0
        self.total = int(total)

    def update(self, stepped, where):
        if stepped:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.total += 1
        log.warning(
            "non-finite gradient norm at %s: step skipped (%d in a row, %d in total)", where, self.in_a_row, self.total
        )
        if self.in_a_row > self.limit:
            raise KwsError(
                f"{self.in_a_row} steps in a row with a non-finite gradient (last at {where}); "
                f"training diverged: lower optim_conf.lr or training_config.grad_clip, check the "
                f"data and the CMVN file (limit: training_config.max_nonfinite_steps={self.limit})"
            )


@dataclass
class TrainState:
    """What the loop reads and changes. `model` is what trains (the KWSModel, or with phone_ctc a
    PhoneCTCModel around it), DDP-wrapped when world_size > 1; `bare_model` the KWSModel alone."""

    model: torch.nn.Module
    bare_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    criterion: object
    dist: Dist
    device: torch.device
    input_dim: int
    min_duration: int
    grad_clip: float
    guard: NonFiniteGuard
    log_interval: int = DEFAULT_LOG_INTERVAL
    rank: int = 0
    step: int = 0
    writer: object = None
    end_anchor: int = None  # training_config.end_anchor
    end_frames: dict = None  # key -> frame where its keyword ends (kws.dataset.keyword_end_frames)
    prefix_negatives: int = None  # training_config.prefix_negatives
    lr_at: object = None  # with lr_schedule cosine: epochs done (a float) -> learning rate; None: plateau
    autocast_dtype: object = None  # PRECISIONS[training_config.precision]
    phone_ctc: float = 0.0  # training_config.phone_ctc: the weight of the phoneme CTC loss (kws.phones)
    phone_targets: dict = None  # key -> phoneme class ids, for the utterances it applies to
    phone_ctc_warped: bool = True  # dataset_conf.mel_warp.phone_ctc: the warped utterances count in it
    confusable_weight: float = 1.0  # training_config.confusable_weight
    confusable_keys: frozenset = frozenset()  # training utterances of the kinds it weighs (kws.datalist)
    engine_adversary: float = 0.0  # training_config.engine_adversary: the weight of the engine loss
    engine_targets: dict = None  # key -> engine class id (kws.adversary), None when it is off
    ema: WeightAverage = None  # training_config.ema_decay: the average evaluated and saved, None when off
    real_frame_norms: list = ()  # training_config.bn_real_frames: the BatchNorms that count real frames only


def target_window(state, keys):
    """(from, before) frames within which each utterance's target keyword counts: from min_duration to
    the end, or with training_config.end_anchor N, within N frames of the keyword's recorded end, so that a
    positive is learned where the whole keyword has just been heard: not at a prefix that is a negative
    of its own (你好问 of 你好问问), nor in the silence after it, which any pause resembles. Utterances
    without a recorded end keep min_duration to the end."""
    if state.end_anchor is None:
        return state.min_duration, None
    ends, anchor, floor = state.end_frames or {}, state.end_anchor, state.min_duration
    starts = [max(floor, ends[key] - anchor) if key in ends else floor for key in keys]
    stops = [ends[key] + anchor + 1 if key in ends else 1 << 30 for key in keys]
    return to_device(starts, state.device), to_device(stops, state.device)


def confusable_weights(state, keys):
    """Each utterance's weight in the training loss: training_config.confusable_weight for the corpus's
    near-misses and partial keywords, 1 for the rest; None when every weight is 1."""
    if state.confusable_weight == 1.0 or not state.confusable_keys:
        return None
    weights = [state.confusable_weight if key in state.confusable_keys else 1.0 for key in keys]
    return to_device(weights, state.device, torch.float32)


def keyword_loss(state, logits, lengths, targets, keys, weights=None):
    """The keyword criterion within each positive's target window (target_window), each utterance
    weighted by `weights` (confusable_weights; CV leaves them out), plus, with
    training_config.prefix_negatives M, the positive's keyword as a negative on its frames more than M
    before the recorded keyword end (kws.loss.prefix_negative_loss): there only a prefix has been heard,
    and a prefix (你好问 of 你好问问) is a negative of its own. Positives without a recorded end add no
    such term. Returns (loss tensor, acc)."""
    loss, acc = state.criterion(logits, lengths, targets, *target_window(state, keys), weights=weights)
    if state.prefix_negatives is not None and state.end_frames:
        margin = state.prefix_negatives
        prefix_end = [state.end_frames[key] - margin if key in state.end_frames else 0 for key in keys]
        loss = loss + prefix_negative_loss(logits, targets, to_device(prefix_end, state.device))
    return loss, acc


def positive_ends(dataset, end_frames):
    """{key: keyword end frame} of the dataset's positives: where dataset_conf.time_warp keeps them."""
    return {
        item["key"]: end_frames[item["key"]]
        for item in dataset.items
        if item["label"] >= 0 and item["key"] in end_frames
    }


def cropped_keys(dataset):
    """Keys of the utterances trained on a window of their audio (dataset_conf.crop_negatives)."""
    return {item["key"] for item, cropped in zip(dataset.items, dataset.cropped) if cropped}


def phone_supervision(tc, train_set):
    """The phoneme classes for training_config.phone_ctc ([] when it is off, or when the training list
    has no `phones`: real corpora train as without it, with a warning)."""
    if not tc.get("phone_ctc"):
        return []
    phones = phone_vocabulary(train_set.items)
    if not phones:
        log.warning(
            "training_config.phone_ctc: no utterance of the training list has `phones` (the synthetic "
            "corpus writes them); training without the phoneme loss"
        )
    return phones


def engine_supervision(tc, train_items):
    """The engines training_config.engine_adversary tells apart ([] when it is off, or when the training
    list names fewer than two: there is nothing to be invariant to, and training goes on without it)."""
    if not tc.get("engine_adversary"):
        return []
    engines = engine_vocabulary(train_items)
    if len(engines) < 2:
        log.warning(
            "training_config.engine_adversary: the training list names %s engine(s) (data.list `engine`); "
            "training without the engine loss",
            len(engines),
        )
        return []
    return engines


def phone_model(trained):
    """The PhoneCTCModel inside what trains (kws.adversary wraps it with engine_adversary)."""
    return trained.trained if isinstance(trained, EngineAdversaryModel) else trained


def kws_model(trained):
    """The KWSModel inside what trains (PhoneCTCModel and EngineAdversaryModel wrap it)."""
    inner = phone_model(trained)
    return inner.model if isinstance(inner, PhoneCTCModel) else inner


def optimizer_step(model, optimizer, grad_clip):
    """Clip, then step unless the gradient norm is not finite. Returns (grad_norm, stepped): 0-dim tensors
    on the gradients' device, read by no one here, so a step costs no host sync. Fused Adam (the default,
    make_optimizer) takes the skip as its `found_inf`, as torch.amp.GradScaler hands it: the kernel leaves
    parameters, moments and step count untouched when it is set. Other optimizers step after the flag is
    read on the host. The gradient is zeroed either way."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip).detach()
    stepped = torch.isfinite(grad_norm)
    if all(group.get("fused") for group in optimizer.param_groups):
        optimizer.found_inf = (~stepped).float()
        optimizer.step()
    elif stepped:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, stepped


def idle_backward(model, input_dim, device):
    """A zero gradient from a rank without a batch, so DDP's gradient all-reduce still matches up."""
    was_training = model.training
    model.eval()  # BatchNorm statistics stay put, no dropout
    feats = torch.zeros(1, 8, input_dim, device=device)
    outputs = model(feats)  # (logits, cache), or (logits, phoneme logits) with training_config.phone_ctc
    (sum(output.float().sum() for output in outputs) * 0.0).backward()
    model.train(was_training)


def batch_backward(state, batch, active_ranks):
    """Forward and backward of one batch, the loss scaled so that DDP's average over all ranks is the
    mean over the `active_ranks` that had a batch. Returns 0-dim tensors on the training device (not
    read here: no host sync): (keyword loss, acc, phoneme CTC loss or nan)."""
    keys, feats, lengths, targets, warped = batch
    host_lengths = lengths.cpu()  # a batch's lengths are on the host (kws.dataset.Featurizer): no copy
    feats, lengths, targets = (to_device(t, state.device) for t in (feats, lengths, targets))
    with real_frames(state.real_frame_norms, lengths, feats.size(1)):
        if state.autocast_dtype is None:
            logits, second, *engine = state.model(feats)
        else:
            with torch.autocast(state.device.type, dtype=state.autocast_dtype):
                logits, second, *engine = state.model(feats)
            logits = logits.float()  # the loss's sigmoid and logs in fp32
    loss, acc = keyword_loss(state, logits, lengths, targets, keys, confusable_weights(state, keys))
    total, phone_loss = loss, torch.full((), float("nan"), device=state.device)
    if state.phone_targets is not None:  # `second` is the phoneme logits (kws.phones.PhoneCTCModel)
        skip = None if state.phone_ctc_warped else warped
        ctc = phone_ctc_loss(second, host_lengths, keys, state.phone_targets, skip)
        total, phone_loss = loss + state.phone_ctc * ctc, ctc.detach()
    if state.engine_targets is not None:  # `engine` holds the engine logits (kws.adversary)
        total = total + state.engine_adversary * engine_loss(engine[0], host_lengths, keys, state.engine_targets)
    scale = state.dist.world_size / active_ranks
    (total * scale if scale != 1 else total).backward()
    return loss.detach(), acc, phone_loss


class EpochSums:
    """An epoch's training statistics, summed on the training device and read at log intervals only: a
    per-step read (loss.item()) would make the host wait for every step the device runs."""

    def __init__(self, device):
        # loss * utterances, acc * utterances, utterances (of steps with a finite loss), grad norm, steps
        self.sums = torch.zeros(5, dtype=torch.float64, device=device)
        self.pending = []  # (batch index, stepped flag tensor) not yet shown to the NonFiniteGuard

    def add_batch(self, loss, acc, count):
        finite = torch.isfinite(loss)
        values = torch.stack((loss.double() * count, acc.double() * count, finite.double() * count))
        self.sums[:3] += torch.where(finite, values, torch.zeros_like(values))

    def add_step(self, batch_index, grad_norm, stepped):
        self.sums[3:] += torch.stack((torch.where(stepped, grad_norm.double(), 0.0), stepped.double()))
        self.pending.append((batch_index, stepped))

    def check(self, guard, epoch):
        """One host sync: the steps since the last check go through the guard (which raises after too many
        non-finite ones in a row)."""
        if not self.pending:
            return
        flags = torch.stack([stepped for _, stepped in self.pending]).tolist()
        for (batch_index, _), stepped in zip(self.pending, flags):
            guard.update(stepped, f"epoch {epoch} batch {batch_index}")
        self.pending = []


def train_one_epoch(state, batches, epoch, counts):
    """One pass over this rank's batches; `counts` are the batches every rank has this epoch (known in
    advance: kws.dataset), so no collective is needed to find out who still has one. Nothing is read back
    from the device between log intervals (EpochSums): non-finite steps are skipped on the device
    (optimizer_step) and counted at each interval, so a diverged run stops within
    training_config.log_interval steps of reaching training_config.max_nonfinite_steps. Returns a dict
    of epoch statistics (identical on every rank)."""
    state.model.train()
    sums = EpochSums(state.device)
    seen = 0
    skipped_before = state.guard.total
    nan = torch.full((), float("nan"), device=state.device)
    batches = iter(batches)
    for batch_index in range(1, max(counts, default=0) + 1):
        active = sum(1 for count in counts if count >= batch_index)
        batch = next(batches) if counts[state.rank] >= batch_index else None
        state.step += 1
        loss = acc = phone_loss = nan
        if batch is not None:
            loss, acc, phone_loss = batch_backward(state, batch, active)
            sums.add_batch(loss, acc, len(batch[0]))
            seen += len(batch[0])
        else:
            idle_backward(state.model, state.input_dim, state.device)
        if state.lr_at is not None:
            lr = state.lr_at(epoch - 1 + (batch_index - 1) / max(counts))
            for group in state.optimizer.param_groups:
                group["lr"] = lr
        grad_norm, stepped = optimizer_step(state.model, state.optimizer, state.grad_clip)
        if state.ema is not None:
            state.ema.update()
        sums.add_step(batch_index, grad_norm, stepped)
        if batch_index % state.log_interval == 0:
            sums.check(state.guard, epoch)
            if state.rank == 0:
                loss_value, acc, grad_norm, phone_loss = torch.stack((loss, acc, grad_norm, phone_loss)).tolist()
                lr = state.optimizer.param_groups[0]["lr"]
                log.info(
                    "epoch %d batch %d loss %.4f acc %.3f grad_norm %.4f lr %.3g%s",
                    epoch,
                    batch_index,
                    loss_value,
                    acc,
                    grad_norm,
                    lr,
                    "" if state.phone_targets is None else f" phone_ctc {phone_loss:.4f}",
                )
                scalars = {"loss": loss_value, "grad_norm": grad_norm, "lr": lr}
                add_scalars(state.writer, "train", scalars, state.step)
    sums.check(state.guard, epoch)
    loss_sum, acc_sum, utts, norm_sum, steps = sums.sums.tolist()
    loss_sum, acc_sum, utts, seen = state.dist.sum([loss_sum, acc_sum, utts, seen])
    return {
        "train_loss": loss_sum / utts if utts else float("nan"),
        "train_acc": acc_sum / utts if utts else float("nan"),
        "train_utts": int(seen),
        "batches": max(counts, default=0),
        "grad_norm": norm_sum / steps if steps else float("nan"),
        "skipped_steps": state.guard.total - skipped_before,
    }


def evaluate(state, batches):
    """CV loss and accuracy over the whole CV list (each rank its shard), all-reduced:
    (loss, acc, utterances)."""
    model = state.bare_model if state.ema is None else kws_model(state.ema.module)
    state.dist.sync_buffers(model)
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=state.device)  # read once, at the end
    utts = 0
    with torch.no_grad():
        for keys, feats, lengths, targets, _warped in batches:
            feats, lengths, targets = (to_device(t, state.device) for t in (feats, lengths, targets))
            logits, _ = model(feats)
            loss, acc = keyword_loss(state, logits, lengths, targets, keys)
            sums += torch.stack((loss.double(), acc.double())) * len(keys)
            utts += len(keys)
    loss_sum, acc_sum = sums.tolist()
    loss_sum, acc_sum, utts = state.dist.sum([loss_sum, acc_sum, utts])
    if utts == 0:
        return float("nan"), float("nan"), 0
    return loss_sum / utts, acc_sum / utts, int(utts)


# -- the run --------------------------------------------------------------------------------------


def train(args):
    rank, local_rank, world_size, local_world = dist_env()
    exit_with_launcher()  # no orphaned workers when torchrun (or Snakemake) is killed
    setup_logging(rank)
    if args.reverb_lmdb or args.noise_lmdb:
        raise KwsError("--reverb_lmdb/--noise_lmdb are not supported: augment the corpus instead")
    config = resolve_config(args)
    model_dir = Path(args.model_dir)
    if rank == 0:
        ensure_dir(model_dir)

    threads = choose_threads(args.threads, local_world)
    torch.set_num_threads(threads)
    device = choose_device(args.gpus, local_rank, local_world)
    backend = resolve_backend(args.dist_backend, use_cuda=device.type == "cuda", no_gpus="this process has none")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if rank == 0:
        # The multi-GPU checklist, before a GPU hour is spent: ids vs processes, visibility, NCCL, clip, workers.
        report = run_preflight(
            {
                "gpus": args.gpus,
                "nproc_per_node": local_world,
                "config": config,
                "threads": args.threads,
                "dist_backend": backend,
            }
        )
        for line in report.ok:
            log.info("preflight: %s", line)
        for line in report:
            log.warning("preflight: %s", line)
    if world_size > 1:
        # Every rank checks in first: a rank that never arrives is named within the timeout, no hang.
        init_distributed(backend, timeout_s=args.timeout)
    try:
        return _train(args, config, model_dir, rank, world_size, device, backend, threads)
    finally:
        cleanup()


def _train(args, config, model_dir, rank, world_size, device, backend, threads):
    from kws.loss import criterion
    from kws.model import build_model, count_parameters, receptive_field

    tc = config["training_config"]
    max_epoch = int(tc["max_epoch"])
    dist = Dist(world_size, device, backend)
    input_dim = input_dim_of(config["dataset_conf"])

    # Data first: a bad list fails before anything is written.
    dictionary = dictionary_arg(args.dict, args.num_keywords)
    train_items = read_data_list(args.train_data, args.num_keywords, dictionary)
    # Long negative streams (the synthetic dev split's) are for choices made by scoring it (kws.phone_choice),
    # not for the per-utterance cv loss that ranks checkpoints, where one 60 s negative would weigh as much
    # as a hundred short utterances.
    cv_items = [
        item for item in read_data_list(args.cv_data, args.num_keywords, dictionary) if item.get("kind") != "stream"
    ]
    stores = {}
    for name, data_list, items, given in (
        ("train", args.train_data, train_items, args.train_audio_store),
        ("cv", args.cv_data, cv_items, args.cv_audio_store),
    ):
        # Decoded once (rank 0 packs a store in model_dir when none is given), then sliced every epoch.
        stores[name] = open_or_build(
            given or model_dir / "audio" / name,
            data_list,
            items,
            build=given is None,
            is_builder=rank == 0,
            wait=lambda: dist.barrier("the audio store", args.timeout),
            threads=threads,
        )
    train_set = KwsDataset(
        args.train_data,
        config["dataset_conf"],
        seed=args.seed,
        rank=rank,
        world_size=world_size,
        items=train_items,
        store=stores["train"],
    )
    cv_conf = cv_dataset_conf(config["dataset_conf"])
    cv_set = KwsDataset(
        args.cv_data, cv_conf, seed=args.seed, rank=rank, world_size=world_size, items=cv_items, store=stores["cv"]
    )
    end_frames = keyword_end_frames(train_items + cv_items, fbank_conf_of(config["dataset_conf"]))
    featurize = Featurizer(
        config["dataset_conf"], args.seed, rank, device, anchors=positive_ends(train_set, end_frames)
    )
    featurize_cv = Featurizer(cv_conf, args.seed, rank, device)

    # Model.
    cmvn = read_cmvn(args.cmvn_file) if args.cmvn_file is not None else None
    if cmvn is not None and len(cmvn["mean_stat"]) != input_dim:
        raise KwsError(
            f"{args.cmvn_file}: statistics are {len(cmvn['mean_stat'])}-dimensional but the features "
            f"are {input_dim}-dimensional (dataset_conf.fbank_conf.num_mel_bins of {args.config}); "
            f"recompute the CMVN file"
        )
    tc["precision"] = resolve_precision(tc["precision"], device, args.config)
    seed_everything(args.seed)
    model = build_model(config["model"], input_dim, args.num_keywords, cmvn)
    if cmvn is not None and not args.norm_var:
        with torch.no_grad():
            model.global_cmvn.istd.fill_(1.0)  # WeKws without --norm_var: subtract the mean only
    model.to(device)
    phones, trained = phone_supervision(tc, train_set), model
    if phones:
        trained = PhoneCTCModel(model, len(phones)).to(device)  # the head's init follows the seed too
        spoken = keyword_phones(train_items, args.num_keywords)  # for the phoneme check (score.phone_check)
    engines = engine_supervision(tc, train_items)
    if engines:
        trained = EngineAdversaryModel(trained, len(engines)).to(device)
    real_frame_norms = use_real_frames(trained) if tc.get("bn_real_frames") else []
    optimizer = make_optimizer(trained, config.get("optim_conf"), args.config)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **SCHEDULER)

    # Resume point: rank 0 chooses (only a checkpoint of this very run), every rank loads the same one.
    fingerprint = run_fingerprint(args, config, world_size, dictionary)
    chosen, payload = choose_checkpoint(args, model_dir, fingerprint, device) if rank == 0 else (None, None)
    resume = load_resume_point(
        dist.broadcast(chosen), payload, config, args.num_keywords, input_dim, world_size, device
    )
    del payload
    state = TrainState(
        model=trained,
        bare_model=model,
        optimizer=optimizer,
        criterion=criterion(tc["criterion"]),
        dist=dist,
        device=device,
        input_dim=input_dim,
        min_duration=args.min_duration,
        grad_clip=float(tc["grad_clip"]),
        guard=NonFiniteGuard(tc["max_nonfinite_steps"]),
        log_interval=int(tc["log_interval"]),
        rank=rank,
        end_anchor=tc.get("end_anchor"),
        prefix_negatives=tc.get("prefix_negatives"),
        lr_at=(
            (lambda done, base=optimizer.defaults["lr"]: cosine_lr(base, done / max_epoch))
            if tc["lr_schedule"] == "cosine"
            else None
        ),
        end_frames=end_frames,
        autocast_dtype=PRECISIONS[tc["precision"]],
        phone_ctc=float(tc.get("phone_ctc") or 0.0),
        phone_targets=phone_targets(train_set.items, phones, cropped_keys(train_set)) if phones else None,
        phone_ctc_warped=(parse_mel_warp(config["dataset_conf"].get("mel_warp")) or {}).get("phone_ctc", True),
        confusable_weight=float(1.0 if tc.get("confusable_weight") is None else tc["confusable_weight"]),
        confusable_keys=frozenset(item["key"] for item in train_items if item.get("kind") in CONFUSABLE_KINDS),
        engine_adversary=float(tc.get("engine_adversary") or 0.0),
        engine_targets=engine_targets(train_items, engines) if engines else None,
        real_frame_norms=real_frame_norms,
    )
    if tc.get("ema_decay") is not None:
        state.ema = WeightAverage(trained, tc["ema_decay"], tc.get("ema_warmup", DEFAULT_WARMUP))
    saved = trained if state.ema is None else state.ema.module  # what a checkpoint's weights are
    if resume.path:
        p = resume.payload
        kws_model(saved).load_state_dict(p["model"])
        if phones:
            phone_model(saved).phone_head.load_state_dict(p["phone_head"])
        if engines:
            saved.engine_head.load_state_dict(p["engine_head"])
        if state.ema is not None:
            trained.load_state_dict(p["training_weights"])
            state.ema.updates = int(p["ema_updates"])
        if p.get("optimizer"):
            optimizer.load_state_dict(p["optimizer"])
        if p.get("scheduler"):
            scheduler.load_state_dict(p["scheduler"])
        state.step = int(p.get("step", 0))
        state.guard.total = int(p.get("skipped_steps_total", 0))
        log.info("resuming from %s: epoch %d of %d", resume.path, resume.start_epoch, max_epoch)
    if world_size > 1:
        state.model = torch.nn.parallel.DistributedDataParallel(
            trained, device_ids=[device.index] if device.type == "cuda" else None
        )

    tsv_path = model_dir / "train_log.tsv"
    final_path = model_dir / "final.yaml"
    history = []
    if rank == 0:
        if resume.start_epoch <= max_epoch and final_path.exists():
            final_path.unlink()  # more epochs to train: the old completion marker no longer holds
        ckpt.write_yaml(model_dir / "config.yaml", config)
        ckpt.write_yaml(
            model_dir / "run_info.yaml",
            run_info(
                args,
                world_size,
                backend,
                device,
                threads,
                resume,
                max_epoch,
                count_parameters(model),
                len(train_items),
                len(cv_items),
            ),
        )
        # This run's records: its epochs only (a lowered max_epoch drops the rows beyond it).
        history = read_tsv(tsv_path, min(resume.start_epoch, max_epoch + 1))
        state.writer = open_writer(
            Path(args.tensorboard_dir) if args.tensorboard_dir else model_dir / "tensorboard",
            purge_step=state.step + 1 if resume.path else None,
        )
        log.info(
            "model: %d parameters; %d train / %d cv utterances; %d process(es) on %s (%s), %d thread(s) each",
            count_parameters(model),
            len(train_items),
            len(cv_items),
            world_size,
            device.type,
            backend if world_size > 1 else "no DDP",
            threads,
        )
        train_set.set_epoch(resume.start_epoch)
        log.info(
            "batches: %s a rank; padded frames %.2fx the real ones (dataset_conf.sort, stratify)",
            "/".join(str(count) for count in train_set.batch_counts()),
            train_set.padding(),
        )
        frames = receptive_field(model, normalisation=False)
        if frames is not None:
            shift_ms = float(train_set.fbank_conf.get("frame_shift", 10))
            log.info(
                "receptive field: %d frames (%.2f s), %d with the normalisation window; "
                "a keyword longer than the first is only ever seen in part",
                frames,
                frames * shift_ms / 1000,
                receptive_field(model),
            )

    for epoch in range(resume.start_epoch, max_epoch + 1):
        seed_everything(epoch_seed(args.seed, epoch, rank))
        lr = optimizer.param_groups[0]["lr"] if state.lr_at is None else state.lr_at(epoch - 1)
        started = time.monotonic()
        train_set.set_epoch(epoch)
        stats = train_one_epoch(state, featurize.batches(train_set, epoch), epoch, train_set.batch_counts())
        cv_loss, cv_acc, cv_utts = evaluate(state, featurize_cv.batches(cv_set, epoch))
        if cv_utts == 0:
            raise KwsError(f"{args.cv_data}: no utterance passed dataset_conf.filter_conf")
        if state.lr_at is None:
            scheduler.step(cv_loss)
        seconds = time.monotonic() - started
        if rank == 0:
            row = {
                "epoch": epoch,
                "train_loss": stats["train_loss"],
                "cv_loss": cv_loss,
                "cv_acc": cv_acc,
                "lr": lr,
                "grad_norm": stats["grad_norm"],
                "skipped_steps": stats["skipped_steps"],
                "seconds": round(seconds, 3),
                "utts_per_s": round(stats["train_utts"] / max(seconds, 1e-9), 2),
            }
            ckpt.save_checkpoint(
                model_dir,
                {
                    "model": kws_model(saved).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "epoch": epoch,
                    "step": state.step,
                    "cv_loss": cv_loss,
                    "cv_acc": cv_acc,
                    "train_loss": stats["train_loss"],
                    "lr": lr,
                    "skipped_steps_total": state.guard.total,
                    "config": config,
                    "num_keywords": args.num_keywords,
                    "input_dim": input_dim,
                    "seed": args.seed,
                    "world_size": world_size,
                    "fingerprint": fingerprint,
                    **(
                        {
                            "phones": phones,
                            "phone_head": phone_model(saved).phone_head.state_dict(),
                            "keyword_phones": spoken,
                        }
                        if phones
                        else {}
                    ),
                    **({"engines": engines, "engine_head": saved.engine_head.state_dict()} if engines else {}),
                    **(
                        {"training_weights": trained.state_dict(), "ema_updates": state.ema.updates}
                        if state.ema is not None
                        else {}
                    ),
                },
                {
                    "cv_loss": cv_loss,
                    "cv_acc": cv_acc,
                    "train_loss": stats["train_loss"],
                    "lr": lr,
                    "grad_norm": stats["grad_norm"],
                    "skipped_steps": stats["skipped_steps"],
                    "train_utterances": stats["train_utts"],
                    "batches": stats["batches"],
                    "seconds": round(seconds, 3),
                    # the warm-up may hold the decay under training_config.ema_decay all run long: say so
                    **({"ema_decay": round(state.ema.current_decay, 6)} if state.ema is not None else {}),
                },
            )
            history.append(row)
            write_tsv(tsv_path, history)
            add_scalars(state.writer, "epoch", {k: row[k] for k in row if k not in ("epoch", "seconds")}, state.step)
            if state.writer is not None:
                state.writer.flush()
            log.info(
                "epoch %d: train_loss %.4f cv_loss %.4f cv_acc %.3f lr %.3g grad_norm %.3f skipped %d "
                "(%.1f s, %.1f utt/s, %d batches)",
                epoch,
                stats["train_loss"],
                cv_loss,
                cv_acc,
                lr,
                stats["grad_norm"],
                stats["skipped_steps"],
                seconds,
                row["utts_per_s"],
                stats["batches"],
            )
            if state.ema is not None:
                log.info(
                    "epoch %d: the moving average's decay %.5f after %d updates (training_config.ema_decay %g)",
                    epoch,
                    state.ema.current_decay,
                    state.ema.updates,
                    state.ema.decay,
                )
        dist.barrier(f"the end of epoch {epoch}", args.timeout)  # nobody runs ahead of a checkpoint

    if rank == 0:
        if resume.start_epoch > max_epoch:
            write_tsv(tsv_path, history)  # nothing trained: the records still end at max_epoch
        epochs = [epoch for epoch, _, _ in ckpt.completed_epochs(model_dir) if epoch <= max_epoch]
        ckpt.write_yaml(
            final_path,
            {
                "max_epoch": max_epoch,
                "epochs": epochs,
                "last_checkpoint": ckpt.checkpoint_name(max_epoch),
                "finished": datetime.datetime.now().isoformat(timespec="seconds"),
            },
        )
        if state.writer is not None:
            state.writer.close()
        log.info("training finished: %s", final_path)
    return 0


def main(argv=None):
    return train(build_parser().parse_args(argv))
