"""Training checkpoints: write them atomically, find the last complete one, rebuild a model from one.

Layout in `<model_dir>` (epochs count from 1):
- `epoch_<NNN>.pt`   dict: model (unwrapped state_dict), optimizer, scheduler, epoch, step, cv_loss,
                     train_loss, lr, config, num_keywords, input_dim, seed, world_size, fingerprint
- `epoch_<NNN>.yaml` sidecar written (atomically) *after* the .pt: epoch, cv_loss, cv_acc, train_loss,
                     lr, grad_norm, skipped_steps, checkpoint. A checkpoint is complete when its
                     sidecar exists and the .pt loads.
- `config.yaml`, `run_info.yaml`, `train_log.tsv`, `tensorboard/`, and `final.yaml` when training ended.

Everything in a payload is plain data and tensors, so checkpoints load with
`torch.load(..., weights_only=True)`.
"""

import logging
import re
from pathlib import Path

import torch
import yaml

from kws.errors import KwsError
from kws.fileio import atomic_open, atomic_torch_save

log = logging.getLogger("kws.checkpoint")

_SIDECAR = re.compile(r"^epoch_(\d+)\.yaml$")


def checkpoint_name(epoch):
    return f"epoch_{int(epoch):03d}.pt"


def sidecar_name(epoch):
    return f"epoch_{int(epoch):03d}.yaml"


# -- writing -------------------------------------------------------------------------------------


def save_checkpoint(model_dir, payload, sidecar):
    """Write `epoch_NNN.pt` and then its sidecar `epoch_NNN.yaml`, each atomically. Returns the .pt path."""
    model_dir = Path(model_dir)
    epoch = int(payload["epoch"])
    path = model_dir / checkpoint_name(epoch)
    atomic_torch_save(payload, path)
    write_yaml(model_dir / sidecar_name(epoch), {"epoch": epoch, **sidecar, "checkpoint": path.name})
    return path


def write_yaml(path, data):
    with atomic_open(path) as out:
        yaml.safe_dump(data, out, sort_keys=False, allow_unicode=True)


# -- reading -------------------------------------------------------------------------------------


def load_payload(path, map_location="cpu"):
    """torch.load a checkpoint (weights_only); KwsError naming the file when it is missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise KwsError(f"{path}: checkpoint not found")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a bad file
        first_line = str(err).splitlines()[0][:200]
        raise KwsError(f"{path}: not a readable checkpoint ({type(err).__name__}: {first_line})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("model"), dict):
        raise KwsError(f"{path}: not a kwsflow checkpoint (no 'model' state dict)")
    return payload


def completed_epochs(model_dir):
    """Epochs with a sidecar in `model_dir`, ascending: [(epoch, sidecar_path, checkpoint_path)]."""
    model_dir = Path(model_dir)
    found = []
    if not model_dir.is_dir():
        return found
    for path in model_dir.iterdir():
        match = _SIDECAR.match(path.name)
        if match:
            found.append((int(match.group(1)), path, model_dir / checkpoint_name(int(match.group(1)))))
    return sorted(found)


def find_resume_checkpoint(model_dir, map_location="cpu"):
    """The newest complete checkpoint of `model_dir` as (epoch, path, payload), or None.

    A checkpoint whose .pt is missing, truncated or corrupt is skipped with a warning that names it
    and the one used instead.
    """
    bad = []
    for epoch, _sidecar, path in reversed(completed_epochs(model_dir)):
        try:
            payload = load_payload(path, map_location)
            if int(payload.get("epoch", -1)) != epoch:
                raise KwsError(f"{path}: holds epoch {payload.get('epoch')!r}, its sidecar says {epoch}")
        except KwsError as err:
            log.warning("skipping incomplete checkpoint: %s", err)
            bad.append(path)
            continue
        if bad:
            log.warning("resuming from %s instead of %s", path, ", ".join(str(b) for b in bad))
        return epoch, path, payload
    if bad:
        log.warning(
            "no loadable checkpoint in %s (bad: %s); starting from scratch", model_dir, ", ".join(str(b) for b in bad)
        )
    return None


def load_model(path, device="cpu"):
    """Rebuild the model of any checkpoint (epoch or averaged): returns (model in eval mode, payload)."""
    from kws.model import build_model

    payload = load_payload(path, map_location=device)
    for key in ("config", "num_keywords", "input_dim"):
        if payload.get(key) is None:
            raise KwsError(f"{path}: checkpoint has no {key!r} (not written by kwsflow training?)")
    config = payload["config"]
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise KwsError(f"{path}: checkpoint config has no 'model' section")
    # CMVN statistics are model buffers: a model built without them gets them from the state dict.
    model = build_model(config["model"], payload["input_dim"], payload["num_keywords"], None)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as err:
        raise KwsError(
            f"{path}: weights do not fit the model its config describes ({str(err).splitlines()[0][:200]})"
        ) from None
    model.to(device)
    model.eval()
    return model, payload
