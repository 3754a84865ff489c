"""Scoring: per-frame keyword posteriors of every test utterance, written as WeKws's score.txt.

`score.txt` has one line per utterance and keyword, in data.list order and keyword-id order:
`key KEYWORD_TOKEN p_1 ... p_T` — sigmoid posteriors of the T valid frames, 6 decimals; with
`phone_check` (alpha > 0, a checkpoint trained with the phoneme head) each checked by the head as
kws.phone_check.PhoneCheck does, each utterance from its first frame (as the detector starts a stream).

Features are `kws.features.compute_fbank` with the checkpoint's fbank settings made inference ones
(`kws.features.inference_fbank`: no random dither, its expected power instead). Utterances
are batched in data.list order, zero-padded at the end; every backbone is causal (and BatchNorm is
per frame in eval mode), so padding never changes a valid frame and results do not depend on the
batch size beyond float rounding. A batch holds at most `batch_size` utterances and
`max_batch_frames` padded frames; a single utterance longer than `max_batch_frames` is run in chunks
carrying the model's streaming cache (equal to the full forward within 1e-5), so memory stays bounded
for hour-long negative streams.
"""

import logging

import numpy as np
import torch

from kws.audio import read_wav
from kws.datalist import keyword_names, read_data_list, read_dictionary
from kws.errors import KwsError
from kws.features import compute_fbank, fbank_conf_of, inference_fbank

log = logging.getLogger("kws.score")

# Padded frames per forward. 20,000, not 200,000: at 200,000 each activation is ~100 MB, which the
# allocator maps and unmaps from the kernel on every op: scoring the default test split spent 36-41 of its
# 88-104 CPU-seconds faulting pages in, and took 1.7x as long (bench/results.md, "Scoring in smaller
# batches"); the scores are the same bytes either way.
DEFAULT_MAX_BATCH_FRAMES = 20_000


def resolve_device(name):
    """`auto` -> cuda when available else cpu; `cuda` without a GPU is an error."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if str(name).startswith("cuda"):
        if not torch.cuda.is_available():
            raise KwsError(f"--device {name}: no CUDA GPU is available (use --device cpu or auto)")
        return torch.device(name)
    raise KwsError(f"--device must be auto, cpu or cuda, got {name!r}")


def utterance_features(item, fbank_conf):
    """fbank [T, D] of one data.list item with inference settings (kws.features.inference_fbank)."""
    samples = read_wav(item["wav"])
    feats = compute_fbank(samples, fbank_conf, dither=0.0)
    if feats.shape[0] == 0:
        raise KwsError(f"{item['wav']}: too short for one feature frame ({item['key']})")
    return feats


def _batches(items, batch_size, max_batch_frames, fbank_conf):
    """Yield lists of (item, feats) in order, within the utterance and padded-frame limits."""
    batch, longest = [], 0
    for item in items:
        feats = utterance_features(item, fbank_conf)
        frames = feats.shape[0]
        if batch and (len(batch) >= batch_size or max(longest, frames) * (len(batch) + 1) > max_batch_frames):
            yield batch
            batch, longest = [], 0
        batch.append((item, feats))
        longest = max(longest, frames)
    if batch:
        yield batch


@torch.no_grad()
def posteriors(network, feats, device, max_frames=DEFAULT_MAX_BATCH_FRAMES):
    """The outputs [B, T, ...] of `network` (kws.model.StreamingWrapper: sigmoid posteriors [B, T, K]; or
    kws.phone_check.PhoneOutputs) for padded features [B, T, D]; long inputs run in cached chunks."""
    feats = feats.to(device)
    batch, frames = feats.shape[0], feats.shape[1]
    chunk = max(1, max_frames // max(batch, 1))
    if frames <= chunk:
        return network(feats)[0].float().cpu()
    outputs, cache = [], None
    for start in range(0, frames, chunk):
        probs, cache = network(feats[:, start : start + chunk], cache)
        outputs.append(probs.float().cpu())
    return torch.cat(outputs, dim=1)


def format_line(key, token, values):
    """`key TOKEN p_1 ... p_T` with 6 decimals."""
    values = np.asarray(values, dtype=np.float64)
    return f"{key} {token} " + ("%.6f " * values.size % tuple(values.tolist())).rstrip() + "\n"


def load_scoring_model(checkpoint, dict_path, device):
    """(model, payload, keyword tokens, dictionary, inference fbank conf) of a checkpoint scored against a
    dictionary; a keyword count that differs from the dictionary's is an error."""
    from kws.checkpoint import load_model

    dictionary = read_dictionary(dict_path)
    tokens = keyword_names(dictionary)
    model, payload = load_model(checkpoint, device=device)
    if payload["num_keywords"] != len(tokens):
        raise KwsError(
            f"{checkpoint}: model has {payload['num_keywords']} keyword output(s) but {dict_path} "
            f"lists {len(tokens)} keyword(s)"
        )
    fbank_conf = inference_fbank(fbank_conf_of((payload.get("config") or {}).get("dataset_conf") or {}))
    return model, payload, tokens, dictionary, fbank_conf


def network_outputs(network, items, fbank_conf, input_dim, device, batch_size, max_batch_frames, where):
    """Yield (item, outputs [T, ...] as numpy) of every item in order: `network` over batches of features."""
    done = 0
    for batch in _batches(items, batch_size, max_batch_frames, fbank_conf):
        dims = {feats.shape[1] for _, feats in batch}
        if dims != {input_dim}:
            raise KwsError(f"{where}: model expects {input_dim}-dim features, fbank gives {dims}")
        padded = torch.nn.utils.rnn.pad_sequence([feats for _, feats in batch], batch_first=True)
        probs = posteriors(network, padded, device, max_batch_frames).numpy()
        for row, (item, feats) in enumerate(batch):
            yield item, probs[row, : feats.shape[0]]
        done += len(batch)
        log.info("scored %d/%d utterances", done, len(items))


def score(
    checkpoint,
    test_data,
    dict_path,
    out,
    batch_size=64,
    device="auto",
    threads=None,
    max_batch_frames=DEFAULT_MAX_BATCH_FRAMES,
    phone_check=0.0,
    phone_check_window=1,
):
    """Score every utterance of `test_data` with `checkpoint`; write `out` atomically. Returns #utterances.

    phone_check: alpha of the phoneme head's check of each keyword over `phone_check_window` frames
    (kws.phone_check.PhoneCheck); 0 or a checkpoint without the head scores with the keyword head alone."""
    from kws.fileio import atomic_open
    from kws.phone_check import inference_network

    if batch_size < 1:
        raise KwsError(f"--batch-size must be >= 1, got {batch_size}")
    if threads:
        torch.set_num_threads(int(threads))
    device = resolve_device(device)
    model, payload, tokens, dictionary, fbank_conf = load_scoring_model(checkpoint, dict_path, device)
    network, check, _ = inference_network(model, payload, phone_check, checkpoint, phone_check_window)
    items = read_data_list(test_data, dictionary=dictionary)
    done = 0
    with atomic_open(out) as handle:
        outputs = network_outputs(
            network, items, fbank_conf, payload["input_dim"], device, batch_size, max_batch_frames, checkpoint
        )
        for item, probs in outputs:
            if check is not None:  # each utterance from the start, as the detector reads a stream
                probs, _ = check.apply(probs, check.init_state())
            for index, token in enumerate(tokens):
                handle.write(format_line(item["key"], token, probs[:, index]))
            done += 1
    return done


__all__ = ["score", "posteriors", "format_line", "resolve_device", "load_scoring_model", "network_outputs"]
