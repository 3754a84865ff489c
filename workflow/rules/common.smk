# Helpers shared by the rules: paths, per-experiment settings, the params each stage depends on.
import functools
import sys
import json
import os
import shlex
from pathlib import Path

from kws.config import experiment_runs, load_model_config
from kws.errors import KwsError
from kws.features import cmvn_fbank
from kws.features import feature_tag as fbank_tag
from kws.launch import (
    check_gpu_budget,
    gpu_launcher,
    gpus_argument,
    import_kws_from,
    slurm_resources,
    train_launcher,
)
from kws.launch import train_mem_mb as kws_train_mem_mb
from kws.recipes import corpus_keywords
from kws.sourcecode import imported_files
from kws.synth.corpus import CorpusSpec

REPO = Path(workflow.basedir).parent
SCRIPTS = REPO / "scripts"
RESULTS = config["results_dir"]
CORPUS = config["corpus"]
DATA = f"{RESULTS}/data/{CORPUS['name']}"
# A smoke run (`--config smoke=true`) trains 1-2 epochs on a slice of the data to look at
# the logs first; it shares corpus and CMVN but writes its experiments under results/smoke/.
SMOKE = config["smoke"]
OUT = f"{RESULTS}/smoke" if SMOKE else RESULTS
HELDOUT_SPLIT = (
    "test_engine"  # a held-out synthesis engine's test split (corpus.heldout_engine)
)
SPLITS = ["train", "dev", "test"] + (
    [HELDOUT_SPLIT] if CORPUS["heldout_engine"] else []
)
EVAL_SPLITS = [s for s in SPLITS if s.startswith("test")]
# One training run per experiment and seed (kws.config.experiment_runs): run name -> (experiment, seed).
# The {exp} wildcard and EXPERIMENTS name runs.
try:
    RUNS = experiment_runs(config["experiments"], config["train"]["seed"])
except KwsError as err:
    sys.exit(f"error: {err}")
EXPERIMENTS = list(RUNS)


wildcard_constraints:
    exp="|".join(EXPERIMENTS),
    split="|".join(SPLITS),


def fail(message):
    sys.exit(f"error: {message}")


# Unset, the recipe would be handed the text "None" and report "None/...: folder not found".
if CORPUS["name"] != "synthetic" and not CORPUS["root"]:
    fail(
        f"config: corpus.root is not set: corpus {CORPUS['name']} is read from the folder you"
        " downloaded and unpacked (see the README's recipes)"
    )


def keywords():
    """Keyword names (lower case, no brackets) of the configured corpus."""
    try:
        return corpus_keywords(CORPUS)
    except KwsError as err:
        fail(str(err))


def workdir_path(path):
    """`path` relative to the working directory: Snakemake records input paths as written, so relative
    ones let a copied or moved project folder (`cp -a`, rsync to scratch) find its results up to date.
    """
    return os.path.relpath(path)


def script(name):
    return workdir_path(SCRIPTS / name)


def code_of(*scripts):
    """The kws modules the given scripts import (transitively), declared as input so that editing any
    of them reruns the stage (kws.sourcecode reads the imports)."""
    return [
        workdir_path(REPO / path)
        for path in imported_files(*(SCRIPTS / name for name in scripts), root=REPO)
    ]


def experiment(exp):
    """The config entry of run `exp`'s experiment."""
    return config["experiments"][RUNS[exp][0]]


def run_record(exp):
    """What resolve_config records of a run: its experiment's entry, the experiment's name and its seed."""
    entry = {k: v for k, v in experiment(exp).items() if k != "seeds"}
    return entry | {"name": RUNS[exp][0], "seed": RUNS[exp][1]}


def model_config_path(exp):
    """An experiment's model config: relative to the working directory, else to the repository."""
    path = Path(experiment(exp)["model"])
    if not path.is_absolute() and not path.exists():
        path = workdir_path(REPO / path)
    return str(path)


@functools.cache
def model_conf(exp):
    try:
        return load_model_config(model_config_path(exp), experiment(exp)["overrides"])
    except KwsError as err:
        fail(f"experiment {exp}: {err}")


def fbank_conf(exp):
    """The fbank settings CMVN depends on: the inference ones (kws.features.cmvn_fbank)."""
    return cmvn_fbank(model_conf(exp)["dataset_conf"])


def feature_tag(exp):
    """A readable folder name per feature setting, so experiments with equal features share CMVN."""
    return fbank_tag(fbank_conf(exp))


FEATURES = {feature_tag(exp): fbank_conf(exp) for exp in EXPERIMENTS}


def cmvn_file(exp):
    return f"{RESULTS}/cmvn/{feature_tag(exp)}/global_cmvn"


def train_gpus(exp):
    """All GPUs of a training job (every node's)."""
    e = experiment(exp)
    return e["gpus"] * e["nodes"]


def train_resource(name):
    """The train rule's resource `name` that shapes its SLURM job (kws.launch.slurm_resources)."""

    def value(wildcards):
        e = experiment(wildcards.exp)
        return slurm_resources(e["gpus"], e["nodes"])[name]

    return value


def train_mem_mb(wildcards):
    e = experiment(wildcards.exp)
    return kws_train_mem_mb(e["gpus"], e["processes"])


def train_processes(exp):
    e = experiment(exp)
    return e["gpus"] if e["gpus"] > 0 else e["processes"]


GPU_LOCKS = f"{RESULTS}/.gpu-locks"


def launcher(exp):
    """The command that starts training: torchrun (through srun on several nodes, with GPU locks)."""
    e = experiment(exp)
    return train_launcher(
        gpus=e["gpus"],
        processes=train_processes(exp),
        nodes=e["nodes"],
        lock_dir=GPU_LOCKS,
    )


def score_launcher():
    """The prefix that runs scoring on a locked GPU (the lock folder training's GPUs are locked in), or none."""
    return gpu_launcher(1, GPU_LOCKS) if config["score"]["gpu"] else ""


def gpu_budget():
    """The `--resources gpu=N` budget, or None when none was given."""
    value = workflow.global_resources.get("gpu")
    return getattr(value, "value", value)


try:
    check_gpu_budget(
        {exp: train_gpus(exp) for exp in EXPERIMENTS}
        | {"scoring": config["score"]["gpu"]},
        gpu_budget(),
    )
except KwsError as err:
    fail(str(err))


def all_targets():
    if SMOKE:
        return [f"{OUT}/{exp}/training.png" for exp in EXPERIMENTS]
    targets = []
    for exp in EXPERIMENTS:
        targets += [
            f"{OUT}/{exp}/metrics.json",
            f"{OUT}/{exp}/det.png",
            f"{OUT}/{exp}/training.png",
            f"{OUT}/{exp}/config.yaml",
            f"{OUT}/{exp}/export/model.onnx",
        ]
        targets += [
            f"{eval_dir(s).format(exp=exp)}/{f}"
            for s in EVAL_SPLITS[1:]
            for f in ("metrics.json", "det.png")
        ]
    if len(EXPERIMENTS) > 1:
        targets += [f"{OUT}/comparison/det.png", f"{OUT}/comparison/metrics.md"]
    return targets


def training_list(split):
    """The data list training reads: the whole split, or in a smoke run its slice."""
    return f"{OUT}/data/{split}/data.list" if SMOKE else f"{DATA}/{split}/data.list"


envvars:
    "PATH",


def clear_logs_of_jobs_to_run():
    """Delete the logs of the jobs this run executes before any starts. Snakemake deletes a job's log
    where the job runs; when a cluster job fails before its rule starts (refused by sbatch, no job
    step), show-failed-logs would print the previous run's log as this one's. (kws.supervise keeps
    every training attempt's log under logs/attempts/.)"""
    for job in workflow.dag.needrun_jobs():
        for log in job.log:
            Path(log).unlink(missing_ok=True)


onstart:
    clear_logs_of_jobs_to_run()


# Scripts and torchrun run with the Python that runs Snakemake, even when its environment is not activated,
# and import the kws package beside this workflow: the code each rule declares is the code it runs.
os.environ["PATH"] = (
    f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
)
import_kws_from(REPO)


# Settings reach each stage as one string of named command-line arguments. Snakemake compares params
# by the sorted repr of their values without names, so two swapped values in separate params would go
# unnoticed; inside one string with the flag names they cannot.


def train_args(exp):
    """train.py's arguments that change the trained model (besides its inputs and the launcher)."""
    t = config["train"]
    overrides = experiment(exp)["overrides"]
    args = [
        gpus_argument(experiment(exp)["gpus"]),
        f"--num_keywords {len(keywords())}",
        f"--seed {RUNS[exp][1]}",
        f"--min_duration {t['min_duration']}",
        f"--ddp.dist_backend {t['dist_backend']}",
    ]
    if SMOKE:
        args.append(f"--max_epoch {config['smoke_epochs']}")
    args += [
        f"--override {shlex.quote(f'{key}={json.dumps(value)}')}"
        for key, value in sorted(overrides.items())
    ]
    return " ".join(args)


def average_args():
    a = config["average"]
    return f"--num {a['num']} --mode {a['mode']}"


def score_args():
    return f"--device {'cuda' if config['score']['gpu'] else 'cpu'}"


def phone_check_chosen():
    """score.phone_check or score.phone_check_window a list: each model's alpha and window are chosen among
    them on its dev split (choose_phone_check)."""
    return any(
        isinstance(config["score"][key], list)
        for key in ("phone_check", "phone_check_window")
    )


def phone_check_input():
    """The chosen check's file, an input of scoring and export when it is chosen."""
    return f"{OUT}/{{exp}}/phone_check.json" if phone_check_chosen() else []


def phone_check_argument():
    """--phone-check and --phone-check-window as configured (no window without a check); when chosen, the
    shell takes the chosen check's file (phone_check_from_file). Plain strings, so that Snakemake's params
    trigger sees a change.
    """
    s = config["score"]
    if phone_check_chosen():
        return ""
    window = (
        f" --phone-check-window {s['phone_check_window']}" if s["phone_check"] else ""
    )
    return f"--phone-check {s['phone_check']:g}{window}"


def phone_check_from_file():
    """The shell's --phone-check of the chosen check's file (an input), when it is chosen."""
    return " --phone-check {input.phone_check}" if phone_check_chosen() else ""


def as_list(value):
    """A config value that may be one item or a list, as a list."""
    return value if isinstance(value, list) else [value]


def phone_check_choice_args():
    """choose_phone_check.py's arguments: the candidates, and the export's FA/h target and negatives."""
    target, negatives = export_target()
    s = config["score"]
    candidates = " ".join(f"{x:g}" for x in as_list(s["phone_check"]))
    windows = " ".join(str(x) for x in as_list(s["phone_check_window"]))
    return (
        f"--candidates {candidates} --windows {windows} --fa-target {target:g} --negatives {negatives}"
        f" --window-shift {config['det']['window_shift']} --step {config['det']['step']:g}"
        f" {score_args()}"
    )


def det_args():
    d = config["det"]
    targets = " ".join(f"{x:g}" for x in d["fa_targets"])
    return f"--step {d['step']:g} --window-shift {d['window_shift']} --fa-targets {targets}"


def export_target():
    """The export's thresholds: the operating point at 1 FA/h (or at the first target when 1 is not listed)
    on the negatives det.export_negatives names."""
    d = config["det"]
    targets = [float(x) for x in d["fa_targets"]]
    return 1.0 if 1.0 in targets else targets[0], d["export_negatives"]


def export_args():
    target, negatives = export_target()
    return f"--fa-target {target:g} --negatives {negatives} --window-shift {config['det']['window_shift']}"


def reference_args(reference_metrics):
    """compute_det's arguments that score a held-out split at the export's thresholds (none for test)."""
    if not reference_metrics:
        return ""
    target, negatives = export_target()
    return (
        f"--reference-metrics {reference_metrics} --reference-fa-target {target:g}"
        f" --reference-negatives {negatives}"
    )


def synth_args():
    c = CORPUS
    train = c["train_utterances"]
    words = " ".join(shlex.quote(w) for w in c["keywords"])
    heldout = c["heldout_engine"]
    return (
        f"--size {c['size']} --seed {c['seed']} {'--augment' if c['augment'] else '--no-augment'}"
        + (f" --train-utterances {train}" if train else "")
        + f" --language {shlex.quote(c['language'])} --keywords {words}"
        + f" --engines {' '.join(c['engines'])}"
        + (f" --heldout-engine {heldout}" if heldout else "")
        + f" --speaker-augment {' '.join(c['speaker_augment'])}"
        + (" --neighbours" if c["neighbours"] else "")
        + (
            f" --near-miss-share {c['near_miss_share']}"
            if c["near_miss_share"] is not None
            else ""
        )
        + f" --variant-share {c['variant_share']}"
    )


def eval_dir(split, for_expand=False):
    """Where an evaluated split's scores, metrics and DET go: test as always, others in a subfolder."""
    parts = [OUT, "{{exp}}" if for_expand else "{exp}"] + (
        [] if split == "test" else [split]
    )
    return os.path.join(*parts)


def eval_rule(name, split):
    return name if split == "test" else f"{name}_{split}"


# A synthetic corpus's engines, languages and phrases are checked at start (a missing engine names its
# Debian package), not after the first hour of a run.
if CORPUS["name"] == "synthetic":
    try:
        CorpusSpec(
            CORPUS["language"],
            CORPUS["keywords"],
            CORPUS["engines"],
            CORPUS["heldout_engine"],
            CORPUS["speaker_augment"],
            CORPUS["neighbours"],
            CORPUS["near_miss_share"],
            CORPUS["variant_share"],
        )
        corpus_keywords(CORPUS)
    except KwsError as err:
        fail(str(err))


def recipe_args():
    c = CORPUS
    words = " ".join(shlex.quote(w) for w in c["keywords"])
    return f"--corpus {c['name']} --root {shlex.quote(str(c['root']))}" + (
        f" --keywords {words}" if words else ""
    )


def audio_stores(wildcards):
    """The audio stores an experiment trains from (the full splits: a smoke run's slices are in them)."""
    return {
        "train_store": f"{RESULTS}/audio/train",
        "cv_store": f"{RESULTS}/audio/dev",
    }
