# Helpers shared by the rules: paths, per-experiment settings, the params each stage depends on.
import functools
import sys
import json
import os
import shlex
from pathlib import Path

from kws.config import load_model_config
from kws.errors import KwsError
from kws.features import fbank_settings
from kws.launch import check_gpu_budget, train_launcher

REPO = Path(workflow.basedir).parent
SCRIPTS = REPO / "scripts"
RESULTS = config["results_dir"]
CORPUS = config["corpus"]
DATA = f"{RESULTS}/data/{CORPUS['name']}"
SPLITS = ["train", "dev", "test"]
EXPERIMENTS = sorted(config["experiments"])

# Keyword tokens per corpus (the recipe writes the same into dict/words.txt).
DEFAULT_KEYWORDS = {
    "synthetic": ["hi_xiaowen", "nihao_wenwen"],
    "mobvoi": ["hi_xiaowen", "nihao_wenwen"],
    "snips": ["hey_snips"],
    "speech_commands": ["yes", "no"],
    "kaldi": [],
}


wildcard_constraints:
    exp="|".join(EXPERIMENTS),
    split="train|dev|test",


def fail(message):
    sys.exit(f"error: {message}")


def keywords():
    """Keyword names (lower case, no brackets) of the configured corpus."""
    words = CORPUS["keywords"] or DEFAULT_KEYWORDS[CORPUS["name"]]
    if not words:
        fail("config: corpus.keywords must list the keywords of a kaldi corpus")
    return [w.strip("<>").lower() for w in words]


def script(name):
    return str(SCRIPTS / name)


def code(*paths):
    """Source files a stage runs, declared as input so that editing them reruns the stage."""
    return [str(REPO / p) for p in paths]


def experiment(exp):
    return config["experiments"][exp]


def model_config_path(exp):
    """An experiment's model config: relative to the working directory, else to the repository."""
    path = Path(experiment(exp)["model"])
    if not path.is_absolute() and not path.exists():
        path = REPO / path
    return str(path)


@functools.cache
def model_conf(exp):
    try:
        return load_model_config(model_config_path(exp), experiment(exp)["overrides"])
    except KwsError as err:
        fail(f"experiment {exp}: {err}")


def fbank_conf(exp):
    """The fbank settings CMVN depends on (dither is a training-time setting)."""
    settings = fbank_settings(model_conf(exp)["dataset_conf"].get("fbank_conf"))
    settings.pop("dither")
    return settings


def feature_tag(exp):
    """A readable folder name per feature setting, so experiments with equal features share CMVN."""
    f = fbank_conf(exp)
    return f"fbank{f['num_mel_bins']}_{f['frame_length']:g}ms_{f['frame_shift']:g}ms"


FEATURES = {feature_tag(exp): fbank_conf(exp) for exp in EXPERIMENTS}


def cmvn_file(exp):
    return f"{RESULTS}/cmvn/{feature_tag(exp)}/global_cmvn"


def train_gpus(exp):
    return experiment(exp)["gpus"]


def train_processes(exp):
    e = experiment(exp)
    return e["gpus"] if e["gpus"] > 0 else e["processes"]


def launcher(exp):
    """The command that starts training: torchrun (through srun on several nodes, with GPU locks)."""
    e = experiment(exp)
    return train_launcher(
        gpus=e["gpus"],
        processes=train_processes(exp),
        nodes=e["nodes"],
        lock_dir=f"{RESULTS}/.gpu-locks",
    )


def gpu_budget():
    """The `--resources gpu=N` budget, or None when none was given."""
    value = workflow.global_resources.get("gpu")
    return getattr(value, "value", value)


try:
    check_gpu_budget(
        {exp: train_gpus(exp) for exp in EXPERIMENTS} | {"scoring": config["score"]["gpu"]},
        gpu_budget(),
    )
except KwsError as err:
    fail(str(err))


def all_targets():
    targets = []
    for exp in EXPERIMENTS:
        targets += [
            f"{RESULTS}/{exp}/metrics.json",
            f"{RESULTS}/{exp}/det.png",
            f"{RESULTS}/{exp}/training.png",
        ]
    if len(EXPERIMENTS) > 1:
        targets += [f"{RESULTS}/comparison/det.png", f"{RESULTS}/comparison/metrics.md"]
    return targets


# Scripts and torchrun run with the Python that runs Snakemake, even when its environment is not activated.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def override_args(exp):
    """`--override key=value` arguments for train.py (values as JSON, which YAML reads back)."""
    overrides = experiment(exp)["overrides"]
    return " ".join(
        f"--override {shlex.quote(f'{key}={json.dumps(value)}')}" for key, value in sorted(overrides.items())
    )
