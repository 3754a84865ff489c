"""Runners of exported models (kws.export's files): `load_exported(path)` opens `model.onnx` with onnxruntime or
the TorchScript `model.pt`, each with `meta` (the export's metadata), `init_cache()` and
`run(feats [1, T, D], cache) -> (posteriors [1, T, K] numpy, new_cache)`. The detector (`kws.detect`) and
the export's own check run exports through these."""

import contextlib
import json
import warnings
from pathlib import Path

import numpy as np
import torch

from kws.errors import KwsError

META_FILE = "meta.json"  # TorchScript extra file


@contextlib.contextmanager
def quiet_warnings():
    """Silence the exporters' and loaders' deprecation and tracer warnings (the export check is what counts)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class OnnxRunner:
    """An exported ONNX model run with onnxruntime (CPU)."""

    backend = "onnx"

    def __init__(self, path, threads=1):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # noqa: BLE001
            raise KwsError(f"{path}: not a loadable ONNX model ({str(err).splitlines()[0][:200]})") from None
        props = self.session.get_modelmeta().custom_metadata_map
        if "kwsflow_meta" not in props:
            raise KwsError(f"{path}: ONNX model has no kwsflow metadata (export it with scripts/export_model.py)")
        self.meta = json.loads(props["kwsflow_meta"])

    def init_cache(self):
        return np.zeros(self.meta["cache_shape"], dtype=np.float32)

    def run(self, feats, cache):
        """feats float32 [1, T, D] (numpy or tensor), cache -> (posteriors np [1, T, K], new_cache)."""
        feats = np.ascontiguousarray(np.asarray(feats, dtype=np.float32))
        posteriors, new_cache = self.session.run(None, {"feats": feats, "cache": cache})
        return posteriors, new_cache


class TorchScriptRunner:
    """An exported TorchScript model (model.pt)."""

    backend = "torchscript"

    def __init__(self, path, threads=None):
        if threads is not None:
            torch.set_num_threads(int(threads))
        extra = {META_FILE: ""}
        try:
            with quiet_warnings():
                self.module = torch.jit.load(str(path), map_location="cpu", _extra_files=extra)
        except Exception as err:  # noqa: BLE001
            raise KwsError(
                f"{path}: not a TorchScript model ({str(err).splitlines()[0][:160]}); "
                f"export a checkpoint with scripts/export_model.py"
            ) from None
        if not extra[META_FILE]:
            raise KwsError(f"{path}: TorchScript model has no {META_FILE} (export it with scripts/export_model.py)")
        self.meta = json.loads(extra[META_FILE])
        self.module.eval()

    def init_cache(self):
        return torch.zeros(self.meta["cache_shape"])

    def run(self, feats, cache):
        feats = torch.as_tensor(feats, dtype=torch.float32)
        with torch.inference_mode():
            posteriors, new_cache = self.module(feats, cache)
        return posteriors.numpy(), new_cache


def load_exported(path, threads=1, backend=None):
    """Open an exported model by suffix (or `backend`): `.onnx` -> onnxruntime, anything else -> TorchScript."""
    path = Path(path)
    if not path.is_file():
        raise KwsError(f"{path}: model file not found")
    if backend == "onnx" or (backend is None and path.suffix.lower() == ".onnx"):
        return OnnxRunner(path, threads=threads)
    return TorchScriptRunner(path, threads=threads)
