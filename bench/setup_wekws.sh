#!/usr/bin/env bash
# Sets up WeKws (wenet-e2e/wekws 1a8ee65) and the wenet it pins (1a94771d) outside this repository, for
# bench/bench_wekws.py (WeKws and kwsflow training throughput side by side):
#
#     bash bench/setup_wekws.sh [TARGET]        # TARGET: default /work/wekws (or $WEKWS_TARGET)
#
# Sources: git repositories (a mirror or a clone; bare is fine) named by WEKWS_SRC and WENET_SRC, default
# the search tool's mirrors under /work/.mirror. PYTHON: the interpreter of kwsflow's venv (default
# .venv/bin/python beside this script's repository); nothing is installed into that venv.
#
# What it makes under TARGET (nothing of WeKws or wenet is copied into this repository):
#   wekws/   the WeKws tree at 1a8ee65 (`git archive`), patched (below)
#   wenet/   wenet's `wenet/` package at 1a94771d (the only part on PYTHONPATH: TARGET/wenet)
#   site/    the extra packages WeKws and wenet import and the venv lacks (librosa, openai-whisper, langid,
#            tensorboardX, scipy and what they need), as `pip install --target`, and sitecustomize.py
#
# Patches, each to the checkout in TARGET, none needed on the GPU machines WeKws is made for:
#   1. wekws/bin/train.py asserts CUDA and calls .cuda() whenever there is more than one process: with
#      CPU ids (--gpus=-1,-1: one per process) it now wraps the model in DistributedDataParallel on the
#      CPU (use --ddp.dist_backend gloo), as it does on GPUs.
#   2. site/sitecustomize.py (imported by every Python started with TARGET/site on PYTHONPATH, the WeKws
#      side only), applied as each module is first imported, so it costs nothing until then:
#      - torchaudio 2.11 has no working `load`/`info` (they moved to torchcodec, not installed) and no
#        `utils.sox_utils`: `torchaudio.load`/`info` read with soundfile; `sox_utils.set_buffer_size`
#        (wenet/dataset/processor.py calls it at import) is a no-op. Sox effects stay missing, so
#        dataset_conf.speed_perturb must stay off.
#      - wenet/squeezeformer/conv2d.py imports Union, Tensor and Optional from torch.nn.modules.conv,
#        which no longer has Union and Optional (wenet/__init__ imports every model, so every WeKws run
#        hits it): the missing ones are put back into that module, from typing (Tensor from torch).
# Torch: openai-whisper (wenet imports its tokenizer's language list) is installed with --no-deps, so pip
# never fetches a torch; the other packages are resolved against the venv (pip --dry-run --report) under
# a constraint file of the venv's own versions, and only the missing ones go into site/ (--no-deps).
# openai-whisper 20231117 is an sdist whose setup.py imports pkg_resources: built with setuptools < 81.
# About 430 MB, nearly all site/ (llvmlite, scipy, scikit-learn, numba). To redo it, remove TARGET's
# wekws/, wenet/ and site/ first (it stops if one exists).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
target=${1:-${WEKWS_TARGET:-/work/wekws}}
wekws_src=${WEKWS_SRC:-/work/.mirror/wenet-e2e+wekws/repo}
wenet_src=${WENET_SRC:-/work/.mirror/wenet-e2e+wenet/repo}
wekws_rev=1a8ee65
wenet_rev=1a94771d
python=${PYTHON:-$here/../.venv/bin/python}
# wenet's requirements pin this release; wenet imports only whisper.tokenizer from it.
whisper=openai-whisper==20231117
extras=(librosa langid tensorboardX scipy tiktoken more-itertools)

git_dir() { # a bare repository or a work tree
    if [ -d "$1/.git" ]; then echo "$1/.git"; else echo "$1"; fi
}

mkdir -p "$target"
target=$(cd "$target" && pwd)
for dir in wekws wenet site; do
    [ ! -e "$target/$dir" ] || {
        echo "error: $target/$dir exists: remove it (or choose another TARGET) first" >&2
        exit 1
    }
done

echo "== WeKws $wekws_rev and wenet $wenet_rev into $target"
# A mirror may lack large blobs elsewhere in the tree (the wenet one lacks a test resource): git archive
# then complains about them and still exits 0, so each checkout is checked file by file against its tree.
checkout() { # SRC REV DEST [PATH]
    local git=(git --git-dir="$(git_dir "$1")")
    mkdir -p "$3"
    "${git[@]}" archive "$2" ${4:+"$4"} 2>"$3.archive.err" | tar -x -C "$3"
    if ! diff <("${git[@]}" ls-tree -r --name-only "$2" ${4:+"$4"} | sort) \
        <(cd "$3" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort) >/dev/null; then
        cat "$3.archive.err" >&2
        echo "error: $3 is not the whole tree of $2${4:+:$4} in $1" >&2
        exit 1
    fi
    rm "$3.archive.err"
}
checkout "$wekws_src" "$wekws_rev" "$target/wekws"
checkout "$wenet_src" "$wenet_rev" "$target/wenet" wenet
git --git-dir="$(git_dir "$wekws_src")" rev-parse "$wekws_rev" >"$target/wekws/REVISION"
git --git-dir="$(git_dir "$wenet_src")" rev-parse "$wenet_rev" >"$target/wenet/REVISION"

echo "== patch 1: wekws/bin/train.py, DDP on the CPU with --gpus=-1,-1"
"$python" - "$target/wekws/wekws/bin/train.py" <<'PY'
import sys
from pathlib import Path

path = Path(sys.argv[1])
old = """    if world_size > 1:
        assert (torch.cuda.is_available())
"""
new = """    if world_size > 1 and gpu < 0:  # kwsflow bench/setup_wekws.sh: DDP on the CPU (gloo)
        model = torch.nn.parallel.DistributedDataParallel(model)
        device = torch.device('cpu')
    elif world_size > 1:
        assert (torch.cuda.is_available())
"""
text = path.read_text()
if text.count(old) != 1:
    sys.exit(f"error: {path}: the DDP block to patch is not there once")
path.write_text(text.replace(old, new))
PY

echo "== extra packages into $target/site (no torch)"
site=$target/site
mkdir -p "$site"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip freeze --exclude-editable >"$work/constraints.txt"
# Its setup.py imports pkg_resources, which setuptools 81 dropped: built with an older setuptools.
echo 'setuptools<81' >"$work/build-constraints.txt"
PIP_CONSTRAINT=$work/build-constraints.txt "$python" -m pip install --quiet --target "$site" --no-deps "$whisper"
"$python" -m pip install --quiet --dry-run --report "$work/missing.json" -c "$work/constraints.txt" \
    "${extras[@]}" >/dev/null
# What the venv lacks, pinned to the versions resolved alongside the venv's own.
mapfile -t missing < <(
    "$python" - "$work/missing.json" <<'PY'
import json
import sys

for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    print(f"{meta['name']}=={meta['version']}")
PY
)
if printf '%s\n' "${missing[@]}" | grep -qi '^torch=='; then
    echo "error: the extra packages would pull a torch: ${missing[*]}" >&2
    exit 1
fi
echo "   ${missing[*]}"
"$python" -m pip install --quiet --target "$site" --no-deps "${missing[@]}"

echo "== $site/sitecustomize.py"
cat >"$site/sitecustomize.py" <<'PY'
"""Written by kwsflow's bench/setup_wekws.sh for WeKws 1a8ee65 and wenet 1a94771d on torch 2.14 and
torchaudio 2.11: soundfile-based torchaudio.load/info and a no-op torchaudio.utils.sox_utils, and the
typing names wenet/squeezeformer/conv2d.py imports from torch.nn.modules.conv. Each fix is applied right
after its module is first imported (a meta-path finder), so a process that never imports torch pays
nothing."""

import importlib.abc
import io
import sys
import types


def _soundfile_source(uri):
    return io.BytesIO(uri) if isinstance(uri, (bytes, bytearray)) else uri


def _load(uri, frame_offset=0, num_frames=-1, normalize=True, channels_first=True, format=None, **_):
    import soundfile
    import torch

    with soundfile.SoundFile(_soundfile_source(uri)) as f:
        native = not normalize and f.subtype in ("PCM_16", "PCM_32")
        f.seek(frame_offset)
        data = f.read(num_frames, dtype=("int16" if f.subtype == "PCM_16" else "int32") if native else "float32",
                      always_2d=True)
        rate = f.samplerate
    waveform = torch.from_numpy(data)
    return (waveform.t().contiguous() if channels_first else waveform), rate


def _info(uri, format=None, **_):
    import soundfile

    meta = soundfile.info(_soundfile_source(uri))
    bits = {"PCM_16": 16, "PCM_24": 24, "PCM_32": 32, "PCM_U8": 8, "FLOAT": 32, "DOUBLE": 64}.get(meta.subtype, 0)
    return types.SimpleNamespace(sample_rate=meta.samplerate, num_frames=meta.frames, num_channels=meta.channels,
                                 bits_per_sample=bits, encoding=meta.subtype)


def _fix_torchaudio(module):
    import torchaudio.utils

    module.load, module.info = _load, _info
    sox_utils = types.ModuleType("torchaudio.utils.sox_utils")
    sox_utils.set_buffer_size = lambda buffer_size: None
    sys.modules[sox_utils.__name__] = torchaudio.utils.sox_utils = sox_utils


def _fix_conv(module):
    from typing import Optional, Union

    from torch import Tensor

    for name, value in (("Optional", Optional), ("Union", Union), ("Tensor", Tensor)):
        if not hasattr(module, name):
            setattr(module, name, value)


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, fix):
        self.loader, self.fix = loader, fix

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.fix(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, fixes):
        self.fixes = fixes

    def find_spec(self, name, path, target=None):
        fix = self.fixes.pop(name, None)
        if fix is None:
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _Loader(spec.loader, fix)
                    return spec
        return None


sys.meta_path.insert(0, _AfterImport({"torchaudio": _fix_torchaudio, "torch.nn.modules.conv": _fix_conv}))
PY

echo "== check: wenet and WeKws import, torchaudio reads a wav"
PYTHONPATH="$site:$target/wekws:$target/wenet" "$python" - <<'PY'
import io
import sys

import numpy as np
import soundfile
import torch
import torchaudio

import wekws.dataset.init_dataset  # noqa: F401  wenet.dataset.processor: librosa, langid, sox_utils
from wekws.model.kws_model import init_model  # noqa: F401
from wenet.text.char_tokenizer import CharTokenizer  # noqa: F401  wenet/__init__: whisper, squeezeformer

buf = io.BytesIO()
soundfile.write(buf, (np.arange(1600) % 100).astype(np.int16), 16000, format="WAV", subtype="PCM_16")
wav, rate = torchaudio.load(io.BytesIO(buf.getvalue()))
assert wav.shape == (1, 1600) and wav.dtype == torch.float32 and rate == 16000, (wav.shape, wav.dtype, rate)
assert torchaudio.info(buf.getvalue()).num_frames == 1600
site = [p for p in sys.path if p.endswith("/site")][0]
assert not torch.__file__.startswith(site), torch.__file__
print(f"   ok: torch {torch.__version__} from {torch.__file__}")
PY
du -sh "$target"
