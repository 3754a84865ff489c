"""Export a trained model for streaming inference: ONNX and TorchScript, verified against PyTorch.

Both exports compute one step of the stream:

    (feats [1, T, D] float32, cache) -> (posteriors [1, T, K] = sigmoid(logits), new_cache)

with a dynamic time axis T; the zero cache (shape `meta["cache_shape"]`) starts a stream. The
metadata (keyword tokens, cache shape, fbank settings, recommended thresholds per keyword) is stored
in the ONNX model's `metadata_props` (key `kwsflow_meta` holds all of it as JSON, plus one key per
field) and in the TorchScript archive as the extra file `meta.json`.

At export time both files are loaded back (onnxruntime, torch.jit.load) and run on test utterances,
whole and chunk by chunk carrying the cache; any posterior further than `tolerance` (EXPORT_TOLERANCE) from the
PyTorch model's whole-utterance posteriors is a KwsError and nothing is written.

`kws.runners.load_exported(path)` opens either file (by suffix) as a runner with `meta`, `init_cache()` and
`run(feats, cache)`; the detector (`kws.detect`) and the export check use the same runners.
"""

import io
import json
import os
from pathlib import Path

import numpy as np
import torch

from kws.errors import KwsError
from kws.features import fbank_conf_of, inference_fbank
from kws.model import StreamingWrapper
from kws.phone_check import PhoneOutputs, inference_network
from kws.runners import META_FILE, OnnxRunner, TorchScriptRunner
from kws.runners import quiet_warnings as _quiet
from kws.tables import DEFAULT_FA_TARGET, recommended_thresholds  # noqa: F401 (export's API)

# Posteriors exported and eager may differ by rounding alone: the backends and chunk sizes sum the
# convolutions in other orders, and the default model's differences reach 1e-5 (up to 1.03e-5 over its
# seeds, 2026-12-07). A streaming or export bug moves a posterior by 1e-3 or more.
EXPORT_TOLERANCE = 1e-4

FORMAT = "kwsflow-streaming-kws"
FORMAT_VERSION = 1
OPSET = 17
DEFAULT_CHUNKS = (1, 10, 37)  # frames per step in the chunked check
SAMPLE_RATE = 16000


# --------------------------------------------------------------------------- metadata


def build_metadata(model, config, keywords, thresholds, threshold_sources=None, phone_check=None):
    """The metadata stored with both exports (plain JSON-able data). phone_check: the description
    kws.phone_check.inference_network gives of the phoneme check, when the export runs it."""
    if len(keywords) != model.num_keywords:
        raise KwsError(f"the dictionary has {len(keywords)} keywords but the model outputs {model.num_keywords}")
    cache = model.init_cache(1)
    training = fbank_conf_of(config.get("dataset_conf") or {})
    fbank = inference_fbank(training)  # no random dither; its expected power (dither_floor) instead
    fbank.update(
        {
            "training_dither": training["dither"],
            "sample_rate": SAMPLE_RATE,
            "snip_edges": True,
            "energy_floor": 0.0,
            "waveform_scale": 32768,
            "implementation": "kws.features.compute_fbank (torchaudio.compliance.kaldi.fbank)",
        }
    )
    if int(fbank["num_mel_bins"]) != model.input_dim:
        raise KwsError(f"config fbank num_mel_bins {fbank['num_mel_bins']} != model input_dim {model.input_dim}")
    outputs = int(model.num_keywords) + (int(phone_check["classes"]) if phone_check else 0)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "keywords": list(keywords),
        "num_keywords": int(model.num_keywords),
        "input_dim": int(model.input_dim),
        "cache_shape": list(cache.shape),
        "inputs": {"feats": [1, "T", int(model.input_dim)], "cache": list(cache.shape)},
        "outputs": {"posteriors": [1, "T", outputs], "new_cache": list(cache.shape)},
        "posteriors": "sigmoid(logits), per frame and keyword"
        + (
            "; then, with phone_check, each phoneme class's probability relative to the frame's best: "
            "the detector's kws.phone_check.PhoneCheck turns them into checked scores"
            if phone_check
            else ""
        ),
        **({"phone_check": phone_check} if phone_check else {}),
        "fbank": fbank,
        "thresholds": {kw: float(thresholds[kw]) for kw in keywords},
        "threshold_sources": dict(threshold_sources or {}),
        "model": config.get("model"),
    }


# --------------------------------------------------------------------------- writing


def write_onnx(wrapper, meta, path, opset=OPSET):
    """Export `wrapper` to ONNX at `path` (dynamic T) and store `meta` in metadata_props."""
    import onnx

    cache = torch.zeros(meta["cache_shape"])
    feats = torch.zeros(1, 20, meta["input_dim"])
    try:
        with _quiet(), torch.no_grad():
            torch.onnx.export(
                wrapper,
                (feats, cache),
                str(path),
                input_names=["feats", "cache"],
                output_names=["posteriors", "new_cache"],
                dynamic_axes={"feats": {1: "T"}, "posteriors": {1: "T"}},
                opset_version=opset,
                dynamo=False,
                do_constant_folding=True,
            )
    except Exception as err:  # noqa: BLE001 - the exporter raises many types
        raise KwsError(f"{path}: ONNX export failed ({type(err).__name__}: {str(err).splitlines()[0][:300]})") from None
    proto = onnx.load(str(path))
    props = {"kwsflow_meta": json.dumps(meta, sort_keys=True)}
    for key in ("keywords", "cache_shape", "fbank", "thresholds", "num_keywords", "input_dim", "format_version"):
        props[key] = json.dumps(meta[key], sort_keys=True)
    del proto.metadata_props[:]
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.producer_name = "kwsflow"
    onnx.checker.check_model(proto)
    onnx.save(proto, str(path))


def write_torchscript(wrapper, meta, path):
    """torch.jit.script the wrapper (torch.jit.trace when scripting fails); save with meta.json.

    Returns "script" or "trace". A trace is checked at other lengths like the script is, by
    `verify_exports`, so a shape frozen by tracing would fail the export."""
    cache = torch.zeros(meta["cache_shape"])
    feats = torch.zeros(1, 20, meta["input_dim"])
    with _quiet():
        try:
            module, how = torch.jit.script(wrapper), "script"
        except Exception:  # noqa: BLE001 - fall back to tracing (static Python control flow only)
            try:
                with torch.no_grad():
                    module, how = torch.jit.trace(wrapper, (feats, cache), check_trace=False), "trace"
            except Exception as err:  # noqa: BLE001
                raise KwsError(
                    f"{path}: TorchScript export failed ({type(err).__name__}: {str(err).splitlines()[0][:300]})"
                ) from None
        module = torch.jit.freeze(module.eval())
        # Saved to memory first: saved to a file, the zip's entries are named after it (here a random
        # temporary name), so two identical exports would differ byte for byte.
        buffer = io.BytesIO()
        torch.jit.save(module, buffer, _extra_files={META_FILE: json.dumps(meta, sort_keys=True)})
    Path(path).write_bytes(buffer.getvalue())
    return how


# --------------------------------------------------------------------------- runners


class EagerRunner(TorchScriptRunner):
    """The PyTorch model itself (reference for the export check, and the benchmark's baseline): run as
    the TorchScript runner runs its module."""

    backend = "pytorch"

    def __init__(self, model, meta, phone_head=None):
        self.module = (StreamingWrapper(model) if phone_head is None else PhoneOutputs(model, phone_head)).eval()
        self.meta = meta


# --------------------------------------------------------------------------- verification


def run_chunked(runner, feats, chunk):
    """Posteriors of feats [1, T, D] fed `chunk` frames at a time, carrying the cache."""
    cache = runner.init_cache()
    outputs = []
    for start in range(0, feats.shape[1], chunk):
        posteriors, cache = runner.run(feats[:, start : start + chunk], cache)
        outputs.append(np.asarray(posteriors))
    return np.concatenate(outputs, axis=1), cache


def _max_abs(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def verify_exports(reference, runners, utterances, chunks=DEFAULT_CHUNKS, tolerance=EXPORT_TOLERANCE):
    """Compare each runner with `reference` on `utterances` ([(key, feats [T, D])]).

    Posteriors whole and chunked (every chunk size in `chunks`) must be within `tolerance` of the
    reference's whole-utterance posteriors; the final cache within tolerance * max(1, |cache|).
    Returns {backend: {"whole": maxdiff, "chunked": maxdiff, "cache": maxdiff}}; KwsError on a mismatch.
    """
    if not utterances:
        raise KwsError("export check: no test utterances")
    report = {}
    failures = []
    for runner in [reference] + list(runners):
        report[runner.backend] = {"whole": 0.0, "chunked": 0.0, "cache": 0.0}
    for key, feats in utterances:
        feats = torch.as_tensor(feats, dtype=torch.float32).unsqueeze(0)
        ref, ref_cache = reference.run(feats, reference.init_cache())
        ref_cache = np.asarray(ref_cache)
        scale = max(1.0, float(np.max(np.abs(ref_cache))) if ref_cache.size else 1.0)
        for runner in [reference] + list(runners):
            stats = report[runner.backend]
            if runner is not reference:
                whole, cache = runner.run(feats, runner.init_cache())
                stats["whole"] = max(stats["whole"], _max_abs(whole, ref))
                stats["cache"] = max(stats["cache"], _max_abs(cache, ref_cache) / scale)
            for chunk in chunks:
                chunked, cache = run_chunked(runner, feats, chunk)
                stats["chunked"] = max(stats["chunked"], _max_abs(chunked, ref))
                stats["cache"] = max(stats["cache"], _max_abs(cache, ref_cache) / scale)
            for what, value in stats.items():
                if not value <= tolerance:  # also catches NaN
                    failures.append(f"{runner.backend} {what} differs by {value:.3g} on {key}")
    if failures:
        raise KwsError(f"export check failed (tolerance {tolerance:g}): " + "; ".join(sorted(set(failures))[:6]))
    return report


# --------------------------------------------------------------------------- top level


def export_artifacts(
    model,
    meta,
    out_dir,
    utterances,
    chunks=DEFAULT_CHUNKS,
    tolerance=EXPORT_TOLERANCE,
    opset=OPSET,
    extra_report=None,
    threads=1,
    deployed=None,
    phone_head=None,
):
    """Write model.onnx, model.pt and export.json into `out_dir` after verifying both exports.

    deployed: a function of the ONNX file's path that scores the deployed detector (kws.deployed) and
    raises KwsError when it disagrees with offline scoring; its report goes into export.json and deployed.md.
    phone_head: the phoneme head whose relative probabilities the exports output after the posteriors (meta's
    phone_check). Everything is built under temporary names and renamed only when the checks pass."""
    from kws.fileio import atomic_open, atomic_path, ensure_dir

    out_dir = ensure_dir(out_dir)
    model = model.eval()
    reference = EagerRunner(model, meta, phone_head)
    wrapper = reference.module
    with atomic_path(out_dir / "model.onnx") as onnx_tmp, atomic_path(out_dir / "model.pt") as ts_tmp:
        write_onnx(wrapper, meta, onnx_tmp, opset=opset)
        how = write_torchscript(wrapper, meta, ts_tmp)
        runners = [OnnxRunner(onnx_tmp, threads=threads), TorchScriptRunner(ts_tmp)]
        for runner in runners:
            if runner.meta != json.loads(json.dumps(meta)):
                raise KwsError(f"export check failed: {runner.backend} metadata did not round-trip")
        diffs = verify_exports(reference, runners, utterances, chunks, tolerance)
        deployed_report = deployed(onnx_tmp) if deployed else None
        report = {
            **(extra_report or {}),
            "files": {"onnx": "model.onnx", "torchscript": "model.pt"},
            "onnx_opset": opset,
            "torchscript_method": how,
            "torch_version": torch.__version__,
            "check": {
                "utterances": [key for key, _ in utterances],
                "frames": int(sum(f.shape[0] for _, f in utterances)),
                "chunk_frames": list(chunks),
                "tolerance": tolerance,
                "max_abs_diff": {
                    "onnx": diffs["onnx"],
                    "torchscript": diffs["torchscript"],
                    "pytorch_chunked": {k: v for k, v in diffs["pytorch"].items() if k != "whole"},
                },
            },
            "meta": meta,
        }
        if deployed_report is not None:
            from kws.deployed import deployed_markdown

            report["deployed"] = deployed_report
            with atomic_open(out_dir / "deployed.md") as handle:
                handle.write(deployed_markdown(deployed_report))
        with atomic_open(out_dir / "export.json") as handle:
            json.dump(report, handle, indent=2)
            handle.write("\n")
    return report


def pick_utterances(items, num):
    """Up to `num` items, round-robin over labels (keyword and filler utterances alike), in file order."""
    by_label = {}
    for item in items:
        by_label.setdefault(item["label"], []).append(item)
    queues = [list(v) for _, v in sorted(by_label.items())]
    chosen = []
    while len(chosen) < num and any(queues):
        for queue in queues:
            if queue and len(chosen) < num:
                chosen.append(queue.pop(0))
    return chosen


def verification_features(data_list, fbank_conf, num, dictionary):
    """[(key, fbank [T, D])] of `num` utterances of a data.list (dither 0, as at inference)."""
    from kws.audio import read_wav
    from kws.datalist import read_data_list
    from kws.features import compute_fbank

    result = []
    for item in pick_utterances(read_data_list(data_list, dictionary=dictionary), num):
        feats = compute_fbank(read_wav(item["wav"]), fbank_conf, dither=0.0)
        if feats.shape[0] > 0:
            result.append((item["key"], feats))
    if not result:
        raise KwsError(f"{data_list}: no utterance long enough for one fbank frame")
    return result


def export_model(
    checkpoint,
    dict_path,
    out_dir,
    test_data,
    metrics=None,
    num_utts=8,
    fa_target=DEFAULT_FA_TARGET,
    negatives="ordinary",
    tolerance=EXPORT_TOLERANCE,
    opset=OPSET,
    score=None,
    refractory=1.0,
    window_shift=50,
    chunk_ms=100,
    workers=1,
    phone_check=0.0,
    phone_check_window=1,
):
    """Export an (averaged) checkpoint to out_dir/{model.onnx, model.pt, export.json}; returns the report.

    score: the offline score.txt of test_data; given, the exported ONNX model also runs as kws-detect does
    over the whole of test_data and must agree with it (kws.deployed). phone_check, phone_check_window:
    alpha and window of the phoneme check (kws.phone_check), as scoring had them; the exports then output the
    phoneme head too."""
    from kws.checkpoint import load_model
    from kws.datalist import keyword_names, read_dictionary

    if num_utts < 1:
        raise KwsError(f"--num-utts must be at least 1, got {num_utts}")
    model, payload = load_model(checkpoint, "cpu")
    config = payload["config"]
    dictionary = read_dictionary(dict_path)
    keywords = keyword_names(dictionary)
    if len(keywords) != model.num_keywords:
        raise KwsError(f"{dict_path}: {len(keywords)} keywords, but {checkpoint} has {model.num_keywords} outputs")
    chosen = recommended_thresholds(metrics, keywords, fa_target, negatives=negatives)
    network, _, check_meta = inference_network(model, payload, phone_check, checkpoint, phone_check_window)
    meta = build_metadata(
        model,
        config,
        keywords,
        {k: v[0] for k, v in chosen.items()},
        {k: v[1] for k, v in chosen.items()},
        phone_check=check_meta,
    )
    utterances = verification_features(test_data, meta["fbank"], num_utts, dictionary)
    extra = {
        "checkpoint": os.fspath(checkpoint),
        "dict": os.fspath(dict_path),
        "metrics": os.fspath(metrics) if metrics else None,
        "test_data": os.fspath(test_data),
        "fa_per_hour_target": fa_target,
        "fa_negatives": negatives,
    }
    deployed = None
    if score is not None:
        from kws.deployed import evaluate_deployed

        def deployed(onnx_path):
            return evaluate_deployed(
                onnx_path, test_data, dict_path, score, refractory, window_shift, chunk_ms, workers, backend="onnx"
            )

    return export_artifacts(
        model,
        meta,
        out_dir,
        utterances,
        tolerance=tolerance,
        opset=opset,
        extra_report=extra,
        deployed=deployed,
        phone_head=network.phone_head if check_meta else None,
    )
