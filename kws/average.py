"""Checkpoint averaging (WeKws `average_model.py`, made strict and exact).

The checkpoints to average are chosen from the training sidecars `<model_dir>/epoch_<NNN>.yaml`
(`epoch`, `cv_loss`, ...), never from a glob over `*.pt`:

* ``mode="best"``: the N checkpoints with the lowest ``cv_loss``; ties go to the earlier epoch.
  A sidecar whose ``cv_loss`` is missing, null or not finite ranks after every finite one.
* ``mode="last"``: the N highest epochs.

Tensor rules (`average_state_dicts`):

* floating-point tensors: element-wise mean, accumulated in float64 and cast back to the
  original dtype (so 30 float32 checkpoints average to the same result in any order, to
  float32 rounding);
* integer and bool tensors (BatchNorm ``num_batches_tracked`` and the like): a mean is
  meaningless, so the element-wise maximum is kept — for a counter that is the value of the
  latest of the averaged checkpoints;
* every checkpoint must have the same keys, shapes and dtypes (else KwsError).

The result has the checkpoint layout that `kws.checkpoint.load_model` reads (`model`, `config`,
`num_keywords`, `input_dim`) with ``epoch: "avg"`` and ``averaged_epochs``; checkpoints trained with
the phoneme head (training_config.phone_ctc) give it their `phone_head` averaged by the same rules, with
`phones` and `keyword_phones` (equal in every epoch), for the phoneme check at scoring. It is written
atomically, and a sidecar `<out>.yaml` lists the epochs, their cv losses and files.
"""

import math
import re
from pathlib import Path

import yaml

from kws.errors import KwsError

SIDECAR_RE = re.compile(r"^epoch_(\d+)\.yaml$")
MODES = ("best", "last")
# training_config.phone_ctc's phoneme classes and each keyword's phonemes: equal in every averaged epoch
PHONE_KEYS = ("phones", "keyword_phones")


def _read_sidecar(path):
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KwsError(f"{path}: file not found") from None
    except yaml.YAMLError:
        raise KwsError(f"{path}: malformed YAML sidecar") from None
    if not isinstance(data, dict):
        raise KwsError(f"{path}: expected a mapping (epoch, cv_loss, ...)")
    return data


def _as_loss(value):
    try:
        loss = float(value)
    except (TypeError, ValueError):
        return math.inf
    return loss if math.isfinite(loss) else math.inf


def find_epochs(model_dir):
    """All epochs with a sidecar in `model_dir`: a list of dicts (epoch, cv_loss, sidecar, checkpoint).

    The epoch comes from the file name (`epoch_<digits>.yaml`, matched by a strict regex); a
    sidecar whose own `epoch` field disagrees is an error. The checkpoint is the sidecar's
    `checkpoint` field (relative to `model_dir` when not absolute) or `epoch_<NNN>.pt` beside it.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise KwsError(f"{model_dir}: model directory not found")
    found = []
    for path in sorted(model_dir.iterdir()):
        match = SIDECAR_RE.match(path.name)
        if not match or not path.is_file():
            continue
        epoch = int(match.group(1))
        data = _read_sidecar(path)
        if "epoch" in data and data["epoch"] is not None:
            try:
                same = int(data["epoch"]) == epoch
            except (TypeError, ValueError):
                same = False
            if not same:
                raise KwsError(f"{path}: sidecar says epoch {data['epoch']!r} but the file name says {epoch}")
        checkpoint = data.get("checkpoint")
        if checkpoint:
            checkpoint = Path(checkpoint)
            if not checkpoint.is_absolute() and not checkpoint.exists():
                checkpoint = model_dir / checkpoint.name
        else:
            checkpoint = path.with_suffix(".pt")
        found.append(
            {"epoch": epoch, "cv_loss": _as_loss(data.get("cv_loss")), "sidecar": path, "checkpoint": Path(checkpoint)}
        )
    return found


def finished_epochs(model_dir):
    """`find_epochs`, limited to the epochs the finished run lists in `final.yaml` when it exists.

    A run retrained with a lower max_epoch leaves later epochs of an earlier run beside its own; they
    must not enter the average.
    """
    epochs = find_epochs(model_dir)
    final = Path(model_dir) / "final.yaml"
    if final.is_file():
        listed = _read_sidecar(final).get("epochs")
        if isinstance(listed, list):
            listed = set(listed)
            epochs = [entry for entry in epochs if entry["epoch"] in listed]
    return epochs


def select_epochs(epochs, num, mode):
    """Choose `num` entries of `find_epochs` output; returned sorted by epoch."""
    if mode not in MODES:
        raise KwsError(f"average mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not isinstance(num, int) or num < 1:
        raise KwsError(f"number of checkpoints to average must be a positive integer, got {num!r}")
    if len(epochs) < num:
        raise KwsError(
            f"asked to average {num} checkpoints ({mode}) but only {len(epochs)} epoch sidecar(s) "
            f"epoch_NNN.yaml exist; train longer or lower the number"
        )
    if mode == "best":
        chosen = sorted(epochs, key=lambda e: (e["cv_loss"], e["epoch"]))[:num]
    else:
        chosen = sorted(epochs, key=lambda e: e["epoch"])[-num:]
    return sorted(chosen, key=lambda e: e["epoch"])


def _is_float(tensor):
    return tensor.is_floating_point() or tensor.is_complex()


class _Accumulator:
    """Running element-wise sums (float64) / maxima (integers) over state dicts of one layout."""

    def __init__(self):
        self.count = 0
        self.ref = None  # key -> (dtype, shape) of the first state dict
        self.first_name = None
        self.values = {}

    def add(self, state, name):
        import torch

        if not isinstance(state, dict) or not state:
            raise KwsError(f"{name}: empty or invalid state dict")
        if self.ref is None:
            self.first_name = name
            self.ref = {}
            for key, value in state.items():
                if not torch.is_tensor(value):
                    raise KwsError(f"{name}: state dict entry {key!r} is not a tensor")
                self.ref[key] = (value.dtype, tuple(value.shape))
                value = value.detach().to("cpu")
                self.values[key] = value.to(torch.float64) if _is_float(value) else value.clone()
            self.count = 1
            return
        if set(state) != set(self.ref):
            extra = sorted(set(state) - set(self.ref))
            missing = sorted(set(self.ref) - set(state))
            raise KwsError(
                f"{name}: parameters differ from {self.first_name} (extra {extra[:3]}, missing {missing[:3]})"
            )
        for key, value in state.items():
            dtype, shape = self.ref[key]
            if not torch.is_tensor(value) or value.dtype != dtype or tuple(value.shape) != shape:
                got = f"{value.dtype} {tuple(value.shape)}" if torch.is_tensor(value) else type(value).__name__
                raise KwsError(f"{name}: {key} is {got}, but {dtype} {shape} in {self.first_name}")
        for key, value in state.items():
            value = value.detach().to("cpu")
            if _is_float(value):
                self.values[key] += value.to(torch.float64)
            elif value.dtype == torch.bool:
                self.values[key] |= value
            else:
                self.values[key] = torch.maximum(self.values[key], value)
        self.count += 1

    def result(self):
        if not self.count:
            raise KwsError("nothing to average")
        out = {}
        for key, (dtype, _shape) in self.ref.items():
            value = self.values[key]
            out[key] = (value / self.count).to(dtype) if value.is_floating_point() or value.is_complex() else value
        return out


def average_state_dicts(state_dicts, names=None):
    """Average state dicts (see the module docstring for the rules). Returns a new state dict."""
    state_dicts = list(state_dicts)
    names = list(names) if names is not None else [f"checkpoint {i}" for i in range(len(state_dicts))]
    acc = _Accumulator()
    for state, name in zip(state_dicts, names):
        acc.add(state, name)
    return acc.result()


def load_payload(path):
    """A training checkpoint on the CPU (`kws.checkpoint.load_payload`, weights_only)."""
    from kws.checkpoint import load_payload as _load

    return _load(path, map_location="cpu")


def average_checkpoints(model_dir, num, mode="best", out=None):
    """Average `num` checkpoints of `model_dir` chosen by `mode`; write `out` (+ `out.yaml`) when given.

    Returns the averaged payload. Checkpoints are read one at a time (running float64 sums), so
    memory stays at about two models whatever `num` is.
    """
    chosen = select_epochs(finished_epochs(model_dir), num, mode)
    acc, heads = _Accumulator(), _Accumulator()
    meta = None
    for entry in chosen:
        path = entry["checkpoint"]
        payload = load_payload(path)
        if meta is None:
            meta = {key: payload.get(key) for key in ("config", "num_keywords", "input_dim", *PHONE_KEYS)}
            meta["path"] = path
        else:
            for key in ("num_keywords", "input_dim", *PHONE_KEYS):
                if payload.get(key) != meta[key]:
                    raise KwsError(f"{path}: {key} {payload.get(key)!r} differs from {meta[key]!r} in {meta['path']}")
            if payload.get("config") is not None:
                meta["config"] = payload["config"]  # the newest epoch's config (all should be equal)
        acc.add(payload["model"], str(path))
        if payload.get("phone_head") is not None:  # the phoneme head, averaged like the model
            heads.add(payload["phone_head"], str(path))
        del payload
    averaged = acc.result()
    epochs = [e["epoch"] for e in chosen]
    cv_losses = [None if math.isinf(e["cv_loss"]) else e["cv_loss"] for e in chosen]
    result = {
        "model": averaged,
        "config": meta["config"],
        "num_keywords": meta["num_keywords"],
        "input_dim": meta["input_dim"],
        "epoch": "avg",
        "cv_loss": None,
        "averaged_epochs": epochs,
        "averaged_cv_losses": cv_losses,
        "average_mode": mode,
    }
    if meta["phones"]:
        result.update(phones=meta["phones"], keyword_phones=meta["keyword_phones"], phone_head=heads.result())
    if out is not None:
        write_average(result, chosen, out)
    return result


def sidecar_path(out):
    out = Path(out)
    return out.with_suffix(".yaml") if out.suffix else out.with_name(out.name + ".yaml")


def write_average(result, chosen, out):
    """Write the averaged checkpoint and its sidecar atomically."""
    from kws.fileio import atomic_open, atomic_torch_save

    out = Path(out)
    atomic_torch_save(result, out)
    info = {
        "epoch": "avg",
        "mode": result["average_mode"],
        "num": len(chosen),
        "averaged_epochs": [e["epoch"] for e in chosen],
        "cv_losses": result["averaged_cv_losses"],
        "checkpoints": [str(e["checkpoint"]) for e in chosen],
        "checkpoint": out.name,
    }
    with atomic_open(sidecar_path(out)) as handle:
        yaml.safe_dump(info, handle, sort_keys=False)
