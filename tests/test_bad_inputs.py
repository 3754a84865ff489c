"""Bad input, table-driven: every case is a one-line `error:` naming the file/line/key, exit status != 0,
and nothing left behind (no output under its final name, no `*.tmp`).

Each case: what it is, how to make it (a function editing a fresh copy of a small valid setup), the
command (a format string over the setup's paths), the expected part of the error (the same), and
the outputs that must not exist afterwards.

Covered elsewhere, not repeated here (same contract, already asserted there):
- wav.scp / text / dictionary problems through make_list (bad, empty, non-wav, 8 kHz, stereo,
  missing audio; duplicate keys, labels not in the dictionary, keys missing on one side, malformed
  lines, piped commands, missing lists): tests/test_lists.py::test_bad_wav, ::test_bad_tables,
  ::test_bad_tables_cli.
- config.yaml schema errors (unknown key, wrong type, negative window shift, unknown corpus) and a
  malformed model YAML: tests/test_workflow.py::test_bad_config_stops_with_the_key_named,
  ::test_malformed_model_config_names_the_file.
- malformed global_cmvn files: tests/test_cmvn.py::test_cli_errors.
Here: the same kinds of fault reaching the *other* readers (data.list consumers: CMVN, training,
scoring, DET), checkpoint/config mismatches, unwritable outputs and config.yaml problems the schema
tests do not reach.
"""

import copy
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import yaml

from conftest import write_test_wav
from helpers_train import TINY_CONFIG as TRAIN_CONFIG
from helpers_train import make_split
from workflow_utils import REPO, TINY_CONFIG, make_workdir, write_config

WORDS = "<FILLER> -1\n<HI_XIAOWEN> 0\n<NIHAO_WENWEN> 1\n"


# ------------------------------------------------------------------------------------ the setup


def _checkpoint(path, config, epoch="avg", seed=0):
    """A kwsflow checkpoint of a freshly initialised model of `config` (what training/averaging write)."""
    from kws.model import build_model

    torch.manual_seed(seed)
    dim = config["dataset_conf"]["fbank_conf"]["num_mel_bins"]
    model = build_model(config["model"], dim, 2, None)
    payload = {
        "model": model.state_dict(),
        "config": config,
        "num_keywords": 2,
        "input_dim": dim,
        "epoch": epoch,
        "cv_loss": 1.0,
    }
    torch.save(payload, path)
    return path


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A small valid setup: test/data.list (7 utterances), words.txt, avg.pt, model/ with 2 epochs, conf.yaml."""
    root = tmp_path_factory.mktemp("bad_inputs_template")
    make_split(root / "test", 7, seed=3)
    (root / "words.txt").write_text(WORDS)
    _checkpoint(root / "avg.pt", TRAIN_CONFIG)
    (root / "model").mkdir()
    for epoch in (1, 2):
        _checkpoint(root / "model" / f"epoch_{epoch:03d}.pt", TRAIN_CONFIG, epoch=epoch, seed=epoch)
        (root / "model" / f"epoch_{epoch:03d}.yaml").write_text(
            yaml.safe_dump({"epoch": epoch, "cv_loss": 1.0 / epoch, "checkpoint": f"epoch_{epoch:03d}.pt"})
        )
    (root / "conf.yaml").write_text(yaml.safe_dump(TRAIN_CONFIG, sort_keys=False))
    dim = TRAIN_CONFIG["dataset_conf"]["fbank_conf"]["num_mel_bins"]
    (root / "cmvn").write_text(json.dumps({"mean_stat": [1000.0] * dim, "var_stat": [10400.0] * dim, "frame_num": 100}))
    # A score file that matches test/data.list (what score.py writes), for the DET cases.
    lines = []
    for item in map(json.loads, (root / "test" / "data.list").read_text().splitlines()):
        for token in ("<HI_XIAOWEN>", "<NIHAO_WENWEN>"):
            lines.append(f"{item['key']} {token} 0.100000 0.900000 0.200000\n")
    (root / "score.txt").write_text("".join(lines))
    return root


class Setup(dict):
    """Paths of one case's copy of the template, usable as `{name}` in commands and messages."""

    def __init__(self, root):
        super().__init__(
            root=root,
            list=root / "test" / "data.list",
            words=root / "words.txt",
            ckpt=root / "avg.pt",
            model_dir=root / "model",
            conf=root / "conf.yaml",
            cmvn=root / "cmvn",
            score=root / "score.txt",
            out=root / "out",
            py=sys.executable,
        )

    def fill(self, text):
        return text.format(**{k: str(v) for k, v in self.items()})


# ------------------------------------------------------------------------------------ how to make each case


def list_items(s):
    return [json.loads(line) for line in s["list"].read_text().splitlines()]


def write_items(s, items):
    s["list"].write_text("".join(json.dumps(item) + "\n" for item in items))


def bad_audio(writer, line=3):
    """Point data.list line `line` at a new file made by writer(path); {bad} is that file."""

    def make(s):
        items = list_items(s)
        bad = s["root"] / "bad" / "x.wav"
        bad.parent.mkdir(exist_ok=True)
        writer(bad)
        items[line - 1]["wav"] = str(bad)
        write_items(s, items)
        s["bad"] = bad

    return make


def edit_list(edit):
    def make(s):
        s["list"].write_text(edit(s["list"].read_text()))

    return make


def duplicate_key(text):
    lines = text.splitlines()
    return "\n".join(lines[:4] + [lines[1]] + lines[4:]) + "\n"


def relabel(old, new):
    return edit_list(lambda text: text.replace(f'"txt": {old}', f'"txt": {new}'))


def edited_checkpoint_config(s):
    """avg.pt whose stored config says hidden_dim 24 while its weights have 12 (someone edited it)."""
    payload = torch.load(s["ckpt"], weights_only=True)
    payload["config"] = copy.deepcopy(payload["config"])
    payload["config"]["model"]["hidden_dim"] = 24
    torch.save(payload, s["ckpt"])


def mixed_shapes(s):
    """model/epoch_002.pt from a model with another hidden_dim than epoch_001.pt."""
    config = copy.deepcopy(TRAIN_CONFIG)
    config["model"]["hidden_dim"] = 8
    _checkpoint(s["model_dir"] / "epoch_002.pt", config, epoch=2, seed=2)


def truncate(name):
    def make(s):
        path = s["root"] / name
        path.write_bytes(path.read_bytes()[:300])  # as left by a full disk

    return make


def regular_file_in_the_way(s):
    """{blocked} is a path under a regular file: no folder can be created there (even as root)."""
    (s["root"] / "file.txt").write_text("not a folder\n")
    s["blocked"] = s["root"] / "file.txt" / "sub"


def chain(*makers):
    def make(s):
        for maker in makers:
            maker(s)

    return make


def workflow_config(edit):
    """A workflow copy (tests/workflow_utils.make_workdir) whose config/config.yaml is edit(TINY_CONFIG)
    (a dict, dumped as YAML) or edit's text as is (a str, for YAML syntax errors)."""

    def make(s):
        make_workdir(s["root"] / "wf")
        value = edit(copy.deepcopy(TINY_CONFIG))
        if isinstance(value, str):
            (s["root"] / "wf" / "config" / "config.yaml").write_text(value)
        else:
            write_config(s["root"] / "wf", value)
        s["wf"] = s["root"] / "wf"

    return make


def set_key(dotted, value):
    def edit(config):
        node = config
        *parents, last = dotted.split("/")
        for part in parents:
            node = node[part]
        node[last] = value
        return config

    return edit


def _wav(**kwargs):
    return lambda path: write_test_wav(path, **kwargs)


def _bytes(data):
    return lambda path: path.write_bytes(data)


def _zero_samples(path):
    soundfile.write(str(path), np.zeros(0, dtype=np.float32), 16000, subtype="PCM_16", format="WAV")


# ------------------------------------------------------------------------------------ the table

CMVN = "{py} scripts/compute_cmvn.py --data-list {list} --fbank-json '{{\"num_mel_bins\": 16}}' --out {out}/global_cmvn"
SCORE = "{py} scripts/score.py --checkpoint {ckpt} --test-data {list} --dict {words} --out {out}/score.txt --device cpu"
DET = "{py} scripts/compute_det.py --score {score} --test-data {list} --dict {words} --out-dir {out}"
AVERAGE = "{py} scripts/average_model.py --model-dir {model_dir} --num 2 --out {out}/avg.pt"
TRAIN = (
    "{py} scripts/train.py --config {conf} --train_data {list} --cv_data {list} --model_dir {out}/model "
    "--num_keywords 2 --min_duration 5 --cmvn_file {cmvn} --norm_var --max_epoch 1 --threads 1"
)
SNAKEMAKE_N = "{py} -m snakemake -n --cores 1 --snakefile {wf}/workflow/Snakefile --directory {wf}"
TRAIN_OUT = ["{out}/model/final.yaml", "{out}/model/epoch_001.pt", "{out}/model/epoch_001.yaml"]


@dataclass
class Case:
    id: str
    what: str
    make: object  # make(setup): edits the copy of the template
    command: str
    expect: str
    outputs: list = field(default_factory=list)


CASES = [
    # --- audio a data.list points at (make_list checks wav.scp; these reach the other readers)
    Case(
        "corrupt_wav",
        "a wav whose header is garbage",
        bad_audio(_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt junk" * 4)),
        CMVN,
        "{bad}: not a readable audio file",
        ["{out}/global_cmvn"],
    ),
    Case(
        "empty_file",
        "a zero-byte .wav",
        bad_audio(_bytes(b"")),
        CMVN,
        "{bad}: not a readable audio file",
        ["{out}/global_cmvn"],
    ),
    Case(
        "no_samples",
        "a valid wav header with no samples",
        bad_audio(_zero_samples),
        CMVN,
        "{bad}: audio file is empty",
        ["{out}/global_cmvn"],
    ),
    Case(
        "not_wav",
        "a text file named .wav",
        bad_audio(_bytes(b"key /some/path.wav\n" * 50)),
        SCORE,
        "{bad}: not a readable audio file",
        ["{out}/score.txt"],
    ),
    Case(
        "rate_8k",
        "8 kHz audio",
        bad_audio(_wav(rate=8000)),
        SCORE,
        "{bad}: sample rate 8000 Hz, expected 16000 Hz",
        ["{out}/score.txt"],
    ),
    Case(
        "stereo",
        "stereo audio (training)",
        bad_audio(_wav(channels=2)),
        TRAIN,
        "{bad}: 2 channels, expected mono",
        TRAIN_OUT,
    ),
    Case(
        "missing_wav",
        "a wav that does not exist",
        bad_audio(lambda path: None),
        CMVN,
        "{bad}: audio file not found",
        ["{out}/global_cmvn"],
    ),
    # --- data.list itself
    Case(
        "malformed_json",
        "a data.list line that is not JSON",
        edit_list(lambda t: t.replace("}\n", "\n", 1)),
        SCORE,
        "{list}:1: malformed JSON",
        ["{out}/score.txt"],
    ),
    Case(
        "duplicate_key",
        "the same key twice in data.list",
        edit_list(duplicate_key),
        CMVN,
        "{list}:5: duplicate key 'utt0001'",
        ["{out}/global_cmvn"],
    ),
    Case(
        "unknown_label",
        "a keyword id the dictionary does not have",
        relabel(1, 7),
        DET,
        "{list}:3: label 7 is not a keyword id (-1..1)",
        ["{out}/metrics.json"],
    ),
    Case(
        "missing_list",
        "a data.list that does not exist",
        lambda s: s["list"].unlink(),
        TRAIN,
        "{list}: file not found",
        TRAIN_OUT,
    ),
    # --- DET
    Case(
        "no_positives",
        "a test set without positives for a keyword",
        relabel(1, -1),
        DET,
        "{list}: keyword <NIHAO_WENWEN> has no positive utterances",
        ["{out}/metrics.json", "{out}/det"],
    ),
    Case(
        "bad_score_line",
        "score.txt with a non-numeric posterior",
        lambda s: s["score"].write_text(s["score"].read_text().replace("0.900000", "nan?", 1)),
        DET,
        "{score}:1: posteriors must be numbers",
        ["{out}/metrics.json"],
    ),
    # --- checkpoints vs configs
    Case(
        "edited_config",
        "score with a checkpoint whose stored model config was edited",
        edited_checkpoint_config,
        SCORE,
        "{ckpt}: weights do not fit the model its config describes",
        ["{out}/score.txt"],
    ),
    Case(
        "mixed_shapes",
        "average checkpoints of two different model shapes",
        mixed_shapes,
        AVERAGE,
        "{model_dir}/epoch_002.pt: preprocessing.0.weight is torch.float32 (8, 16)",
        ["{out}/avg.pt", "{out}/avg.yaml"],
    ),
    Case(
        "truncated_avg",
        "score with a truncated checkpoint",
        truncate("avg.pt"),
        SCORE,
        "{ckpt}: not a readable checkpoint",
        ["{out}/score.txt"],
    ),
    Case(
        "truncated_epoch",
        "average with a truncated epoch checkpoint",
        truncate("model/epoch_001.pt"),
        AVERAGE,
        "{model_dir}/epoch_001.pt: not a readable checkpoint",
        ["{out}/avg.pt", "{out}/avg.yaml"],
    ),
    Case(
        "cmvn_dim",
        "a global_cmvn with another feature dimension than the config",
        lambda s: s["cmvn"].write_text(json.dumps({"mean_stat": [1.0] * 40, "var_stat": [2.0] * 40, "frame_num": 1})),
        TRAIN,
        "{cmvn}: statistics are 40-dimensional but the features are 16-dimensional",
        TRAIN_OUT,
    ),
    Case(
        "bad_override",
        "a mistyped --override value",
        lambda s: None,
        TRAIN + " --override optim_conf.lr=fast",
        "{conf}: optim_conf.lr must be a number, got 'fast'",
        TRAIN_OUT,
    ),
    # --- outputs that cannot be written (a path under a regular file: chmod does not stop root)
    Case(
        "unwritable_score",
        "score.txt under a regular file",
        regular_file_in_the_way,
        SCORE.replace("{out}", "{blocked}"),
        "{blocked}: cannot create output folder",
        ["{blocked}"],
    ),
    Case(
        "unwritable_det",
        "DET outputs under a regular file",
        regular_file_in_the_way,
        DET.replace("{out}", "{blocked}"),
        "{blocked}: cannot create output folder",
        ["{blocked}"],
    ),
    Case(
        "unwritable_model_dir",
        "a training model_dir under a regular file",
        regular_file_in_the_way,
        TRAIN.replace("{out}", "{blocked}"),
        "{blocked}/model: cannot create output folder",
        ["{blocked}"],
    ),
    # --- the workflow's config.yaml (snakemake -n)
    Case(
        "config_yaml_syntax",
        "config.yaml that is not YAML",
        workflow_config(lambda c: "train: {seed: 1\n"),
        SNAKEMAKE_N,
        "config/config.yaml:2: malformed YAML",
        [],
    ),
    Case(
        "config_wrong_type",
        "a config value of the wrong type",
        workflow_config(set_key("train/seed", "six")),
        SNAKEMAKE_N,
        "error: config: train.seed",
        [],
    ),
    Case(
        "config_missing_model",
        "an experiment whose model config does not exist",
        workflow_config(set_key("experiments/tiny/model", "config/models/nope.yaml")),
        SNAKEMAKE_N,
        "nope.yaml",
        [],
    ),
    Case(
        "config_unknown_override",
        "an override of a key the model config does not have",
        workflow_config(set_key("experiments/tiny/overrides", {"model.hiden_dim": 8})),
        SNAKEMAKE_N,
        "model.hiden_dim",
        [],
    ),
]


def leftovers(setup):
    return sorted(str(p) for p in setup["root"].rglob("*.tmp"))


_SCRIPTS = {}


def run_script(argv, capsys):
    """`python scripts/x.py ARGS` as the script's main(ARGS) in this process (no interpreter and torch
    start-up per case); returns (exit status, stdout, stderr). An exception other than the SystemExit
    of `kws.errors.cli` propagates and fails the test: that would be a traceback for the user."""
    import importlib.util
    import logging

    path = REPO / argv[0]
    if path not in _SCRIPTS:
        spec = importlib.util.spec_from_file_location(f"bad_inputs_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SCRIPTS[path] = module
    threads, saved = torch.get_num_threads(), {}
    for name in ("", "kws"):
        logger = logging.getLogger(name)
        saved[name] = (logger, logger.level, list(logger.handlers))
    try:
        try:
            code = _SCRIPTS[path].main(argv[1:]) or 0
        except SystemExit as exit_:
            code = exit_.code
    finally:
        torch.set_num_threads(threads)
        for logger, level, handlers in saved.values():
            logger.setLevel(level)
            logger.handlers[:] = handlers
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", CASES, ids=[getattr(c, "id", None) or c.values[0].id for c in CASES])
def test_bad_input(template, tmp_path, case, capsys, monkeypatch):
    import shutil

    root = tmp_path / "case"
    shutil.copytree(template, root)
    setup = Setup(root)
    case.make(setup)
    argv = shlex.split(setup.fill(case.command))
    monkeypatch.chdir(REPO)
    if argv[1].startswith("scripts/"):
        code, stdout, stderr = run_script(argv[1:], capsys)
    else:  # snakemake: a process of its own
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        code, stdout, stderr = result.returncode, result.stdout, result.stderr
    lines = stderr.strip().splitlines()
    context = f"{case.what}\nstdout: {stdout[-2000:]}\nstderr: {stderr[-3000:]}"
    assert code != 0, context
    assert lines and lines[-1].startswith("error: "), context
    assert setup.fill(case.expect) in lines[-1], context
    assert "Traceback" not in stderr, context
    for output in case.outputs:
        assert not Path(setup.fill(output)).exists(), (output, context)
    assert leftovers(setup) == [], context
