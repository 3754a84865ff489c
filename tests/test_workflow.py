"""The Snakemake workflow: config checks, lint, the tiny pipeline end to end, and rerun semantics."""

import copy
import json
import shutil
import subprocess
import sys

import pytest
import yaml

from workflow_utils import REPO, TINY_CONFIG, make_workdir, planned_jobs, snakemake, write_config

DATA_JOBS = {"synthesize_corpus", "make_list"}
# What follows each stage (resolve_config records the settings, so any setting change rewrites it;
# the export embeds the DET operating thresholds, so it follows scoring).
SCORING_ONWARD = {"compute_det", "plot_det", "export_model", "resolve_config"}
AVERAGING_ONWARD = SCORING_ONWARD | {"average_model", "score"}
TRAIN_ONWARD = AVERAGING_ONWARD | {"train", "plot_training"}


def with_changes(**changes):
    """TINY_CONFIG with dotted keys changed, e.g. with_changes(**{"det.window_shift": 40})."""
    config = copy.deepcopy(TINY_CONFIG)
    for dotted, value in changes.items():
        node = config
        *parents, last = dotted.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return config


# ---------------------------------------------------------------- fast checks (no pipeline run)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"train": {"num_workerz": 1}}, "unknown key train.num_workerz"),
        ({"average": {"num": "ten"}}, "average.num: 'ten' is not of type 'integer'"),
        ({"det": {"window_shift": -1}}, "det.window_shift"),
        ({"corpus": {"name": "librispeech"}}, "corpus.name"),
    ],
)
def test_bad_config_stops_with_the_key_named(tmp_path, change, message):
    config = copy.deepcopy(TINY_CONFIG)
    for section, values in change.items():
        config.setdefault(section, {}).update(values)
    make_workdir(tmp_path, config)
    result = snakemake(tmp_path, "-n")
    assert result.returncode != 0
    assert f"error: config: {message}" in result.stderr + result.stdout


def test_malformed_model_config_names_the_file(tmp_path):
    make_workdir(tmp_path)
    (tmp_path / "config" / "models" / "tiny.yaml").write_text("model: [unclosed\n")
    result = snakemake(tmp_path, "-n")
    assert result.returncode != 0
    assert "tiny.yaml" in result.stderr and "malformed YAML" in result.stderr


def test_gpu_request_above_budget_fails_instead_of_being_clamped(tmp_path):
    config = with_changes(**{"experiments/tiny/gpus": 4})
    make_workdir(tmp_path, config)
    result = snakemake(tmp_path, "-n", "--resources", "gpu=2")
    assert result.returncode != 0
    assert "tiny asks for 4 GPU(s) but `--resources gpu=2` grants only 2" in result.stderr


def test_lint_and_format_are_clean():
    lint = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint", "--cores", "1"], cwd=REPO, capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "Congratulations" in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    if shutil.which("snakefmt") is None:
        pytest.skip("snakefmt not installed")
    fmt = subprocess.run(["snakefmt", "--check", "workflow"], cwd=REPO, capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stderr


# ---------------------------------------------------------------- the tiny pipeline, end to end


@pytest.fixture(scope="module")
def completed_run(tmp_path_factory):
    root = make_workdir(tmp_path_factory.mktemp("pipeline"))
    result = snakemake(root)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return root


@pytest.mark.slow
def test_pipeline_writes_metrics_plots_and_stats(completed_run):
    exp = completed_run / "results" / "tiny"
    metrics = json.loads((exp / "metrics.json").read_text())
    assert set(metrics["keywords"]) == {"hi_xiaowen", "nihao_wenwen"}
    for name in ("det.png", "training.png", "score.txt", "avg.pt", "config.yaml", "metrics.md"):
        assert (exp / name).stat().st_size > 0, name
    stats = (exp / "det" / "stats.hi_xiaowen.txt").read_text().split("\n")
    assert len([line for line in stats if line.strip()]) == 100
    resolved = yaml.safe_load((exp / "config.yaml").read_text())
    assert resolved["training_config"]["max_epoch"] == 2


@pytest.mark.slow
def test_second_run_has_nothing_to_do(completed_run):
    assert planned_jobs(snakemake(completed_run, "-n")) == {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"det/window_shift": 40}, SCORING_ONWARD),
        ({"det/step": 0.02}, SCORING_ONWARD),
        ({"average/num": 1}, AVERAGING_ONWARD),
        ({"average/mode": "last"}, AVERAGING_ONWARD),
        ({"experiments/tiny/overrides": {"training_config.max_epoch": 2, "training_config.grad_clip": 1.0}}, TRAIN_ONWARD),
        ({"experiments/tiny/overrides": {"training_config.max_epoch": 2, "optim_conf.lr": 0.01}}, TRAIN_ONWARD),
        ({"experiments/tiny/overrides": {"training_config.max_epoch": 2, "model.hidden_dim": 24}}, TRAIN_ONWARD),
        ({"train/seed": 667}, TRAIN_ONWARD),
        ({"experiments/tiny/processes": 1}, TRAIN_ONWARD),
        # Swapped values: Snakemake alone would not notice (params compare values without names).
        ({"train/num_workers": 5, "train/min_duration": 0}, TRAIN_ONWARD),
        (
            {"experiments/tiny/overrides": {"training_config.max_epoch": 2, "dataset_conf.fbank_conf.num_mel_bins": 32}},
            TRAIN_ONWARD | {"compute_cmvn"},
        ),
        ({"corpus/seed": 1}, TRAIN_ONWARD | DATA_JOBS | {"compute_cmvn"}),
        ({"corpus/train_utterances": 30}, TRAIN_ONWARD | DATA_JOBS | {"compute_cmvn"}),
        ({"train/timeout_s": 30}, {"resolve_config"}),
    ],
    ids=lambda value: json.dumps(value, sort_keys=True) if isinstance(value, dict) else None,
)
def test_a_changed_setting_reruns_exactly_its_stage_onward(completed_run, changes, expected):
    write_config(completed_run, with_changes(**changes))
    try:
        planned = planned_jobs(snakemake(completed_run, "-n"))
    finally:
        write_config(completed_run, TINY_CONFIG)
    planned.pop("all", None)
    assert set(planned) == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, expected",
    [
        ("scripts/score.py", {"score", "compute_det", "plot_det", "export_model"}),
        ("scripts/compute_det.py", {"compute_det", "plot_det", "export_model"}),
        ("scripts/train.py", TRAIN_ONWARD - {"resolve_config"}),
        ("scripts/compute_cmvn.py", TRAIN_ONWARD - {"resolve_config"} | {"compute_cmvn"}),
    ],
)
def test_an_edited_script_reruns_its_stage_onward(completed_run, script, expected):
    path = completed_run / script
    original = path.read_text()
    path.write_text(original + "\n# edited\n")
    try:
        planned = planned_jobs(snakemake(completed_run, "-n"))
    finally:
        path.write_text(original)
    planned.pop("all", None)
    assert set(planned) == expected


@pytest.mark.slow
def test_smoke_run_trains_on_a_slice_without_touching_the_full_run(completed_run):
    result = snakemake(completed_run, "-n", "-p", "--config", "smoke=True", "smoke_utterances=8")
    planned = planned_jobs(result)
    planned.pop("all", None)
    assert planned == {"smoke_slice": 2, "train": 1, "plot_training": 1}
    output = result.stdout + result.stderr
    assert "--max_epoch 2" in output
    assert "results/smoke/tiny/model" in output
    assert "results/tiny/" not in output.replace("results/smoke/tiny/", "")


@pytest.mark.slow
def test_two_experiments_share_data_and_yield_a_comparison(tmp_path):
    config = copy.deepcopy(TINY_CONFIG)
    config["experiments"]["tiny_clip1"] = {
        "model": "config/models/tiny.yaml",
        "overrides": {"training_config.max_epoch": 1, "training_config.grad_clip": 1.0},
        "processes": 1,
    }
    config["average"]["num"] = 1
    make_workdir(tmp_path, config)
    plan = planned_jobs(snakemake(tmp_path, "-n"))
    assert plan["synthesize_corpus"] == 1 and plan["compute_cmvn"] == 1 and plan["train"] == 2
    result = snakemake(tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    table = (tmp_path / "results" / "comparison" / "metrics.md").read_text()
    assert "tiny" in table and "tiny_clip1" in table
    assert (tmp_path / "results" / "comparison" / "det.png").stat().st_size > 0


@pytest.mark.slow
def test_report_gathers_plots_metrics_and_configs(completed_run):
    result = snakemake(completed_run, "--report", "report.html")
    assert result.returncode == 0, result.stderr[-3000:]
    html = (completed_run / "report.html").read_text(errors="replace")
    for name in ("det.png", "training.png", "metrics.tsv", "config.yaml", "DET"):
        assert name in html, name
