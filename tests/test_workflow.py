"""The Snakemake workflow: config checks, lint, the tiny pipeline end to end, and rerun semantics."""

import copy
import json
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from workflow_utils import REPO, TINY_CONFIG, make_workdir, planned_jobs, snakemake, write_config

DATA_JOBS = {"synthesize_corpus", "make_list", "pack_audio"}
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
        *[
            ({"corpus": {"name": name, "keywords": keywords}}, f"corpus.root is not set: corpus {name} is read from")
            for name, keywords in [("mobvoi", []), ("speech_commands", []), ("snips", []), ("kaldi", ["<HEY>"])]
        ],
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


def readme_section(title):
    """The text of a `### title` section of config/README.md."""
    text = (REPO / "config" / "README.md").read_text()
    return text.split(f"### {title}\n", 1)[1].split("\n#", 1)[0]


def test_documented_ways_to_set_a_key_inside_a_section_work(tmp_path):
    config = with_changes(**{"corpus/seed": 7})
    make_workdir(tmp_path, config)
    commands = [
        line for line in readme_section("Changing settings for one run").splitlines() if line.startswith("snakemake ")
    ]
    assert len(commands) == 2 and {"--config", "--configfile"} <= {w for c in commands for w in shlex.split(c)}
    for command in commands:
        command, _, comment = command.partition("#")
        if "--configfile" in command:  # the file's content is given in the comment
            name, _, content = comment.strip().partition(": ")
            (tmp_path / name).write_text(yaml.safe_dump(yaml.safe_load(content)))
        result = snakemake(tmp_path, "-n", "--printshellcmds", *shlex.split(command)[1:])
        assert result.returncode == 0, command + result.stderr[-3000:]
        assert "prepare_corpus.py --corpus mobvoi --root /data/mobvoi " in result.stdout, command
        # merged, not replaced: the corpus keys not named keep the config file's values
        pipeline = next(
            line
            for line in result.stdout.splitlines()
            if "resolve_config.py" in line and line.startswith("Shell command:")
        )
        assert '"seed": 7' in pipeline and '"name": "mobvoi"' in pipeline, pipeline


def test_dotted_config_key_fails_as_documented_before_anything_is_written(tmp_path):
    # Snakemake refuses it in its own argument parsing, before the Snakefile runs: the README says so
    # and quotes the message, so a user searching for it finds the forms that work.
    make_workdir(tmp_path)
    result = snakemake(tmp_path, "-n", "--config", "corpus.name=mobvoi")
    assert result.returncode != 0
    documented = next(
        line for line in readme_section("Changing settings for one run").splitlines() if line.startswith("ValueError:")
    )
    assert documented in (result.stdout + result.stderr).splitlines()
    assert not (tmp_path / "results").exists()


def test_default_training_command_passes_preflight_on_two_cpus(tmp_path, monkeypatch):
    # The README's machine: 2 cores. The default config must not warn about its own settings every run.
    from kws.preflight import CudaInfo, run_preflight
    from kws.trainer import build_parser, resolve_config

    make_workdir(tmp_path, yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    result = snakemake(tmp_path, "-n", "--printshellcmds", "--cores", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(
        line for line in result.stdout.splitlines() if line.startswith("Shell command:") and "scripts/train.py" in line
    )
    words = shlex.split(line.removeprefix("Shell command:"))
    start = next(i for i, word in enumerate(words) if word.endswith("scripts/train.py")) + 1
    args = build_parser().parse_args(words[start : words.index(">")] if ">" in words else words[start:])
    monkeypatch.chdir(tmp_path)  # the model config's path is relative to the working directory
    report = run_preflight(
        {
            "gpus": args.gpus,
            "nproc_per_node": int(words[words.index("--nproc_per_node") + 1]),
            "config": resolve_config(args),
            "num_workers": args.num_workers,
            "threads": args.threads,
            "dist_backend": args.dist_backend,
        },
        cuda=CudaInfo.fake(0),
        check_port_free=False,
    )
    assert report.cpus == 2 and list(report) == []


def test_a_gpu_training_cuda_cannot_use_stops_instead_of_training_on_the_cpu(tmp_path, monkeypatch):
    """`gpus: 1` where CUDA cannot use the device (here a fake id, 99, that no CUDA device has) stops with
    the reason; it used to train on the CPU with gloo and report success."""
    root = make_workdir(tmp_path, with_changes(**{"experiments/tiny/gpus": 1}))
    monkeypatch.setenv("KWS_VISIBLE_GPUS", "99")  # what kws.gpu may choose from (tests/test_gpu.py)
    result = snakemake(root, "--resources", "gpu=1", "--config", "smoke=True", "smoke_utterances=8")
    assert result.returncode != 0
    log = (root / "results" / "smoke" / "logs" / "train.tiny.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=99" in log
    assert "error: --gpus 0: CUDA cannot use any device here" in log
    assert "training finished" not in log
    assert not (root / "results" / "smoke" / "tiny" / "model" / "final.yaml").exists()


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


def test_test_config_plans_the_tiny_pipeline():
    """`snakemake --directory .test` (snakemake-workflows' test config) runs the tiny pipeline from the
    checkout itself: its config/config.yaml is found, its model path resolves, every stage is planned."""
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--directory", ".test", "--cores", "2", "-n", "--forceall"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    jobs = planned_jobs(result)
    assert jobs["train"] == 1 and jobs["export_model"] == 1 and jobs["all"] == 1, jobs
    assert "results/tiny/export/model.onnx" in result.stdout


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
        # the phoneme check reads the averaged model: rescored and re-exported, never retrained
        ({"score/phone_check": 0.5}, SCORING_ONWARD | {"score"}),
        # a list: the alpha is chosen on the dev split first
        ({"score/phone_check": [0, 0.5]}, SCORING_ONWARD | {"score", "choose_phone_check"}),
        ({"score/phone_check": 0.5, "score/phone_check_window": 50}, SCORING_ONWARD | {"score"}),
        # a list of windows alone: chosen on the dev split with the one alpha
        ({"score/phone_check_window": [1, 50]}, SCORING_ONWARD | {"score", "choose_phone_check"}),
        (
            {"experiments/tiny/overrides": {"training_config.max_epoch": 2, "training_config.grad_clip": 1.0}},
            TRAIN_ONWARD,
        ),
        ({"experiments/tiny/overrides": {"training_config.max_epoch": 2, "optim_conf.lr": 0.01}}, TRAIN_ONWARD),
        ({"experiments/tiny/overrides": {"training_config.max_epoch": 2, "model.hidden_dim": 24}}, TRAIN_ONWARD),
        ({"train/seed": 667}, TRAIN_ONWARD),
        ({"experiments/tiny/processes": 1}, TRAIN_ONWARD),
        # Swapped values: Snakemake alone would not notice (params compare values without names).
        ({"train/seed": 5, "train/min_duration": 666}, TRAIN_ONWARD),
        (
            {
                "experiments/tiny/overrides": {
                    "training_config.max_epoch": 2,
                    "dataset_conf.fbank_conf.num_mel_bins": 32,
                }
            },
            TRAIN_ONWARD | {"compute_cmvn"},
        ),
        ({"corpus/seed": 1}, TRAIN_ONWARD | DATA_JOBS | {"compute_cmvn"}),
        ({"corpus/train_utterances": 30}, TRAIN_ONWARD | DATA_JOBS | {"compute_cmvn"}),
        ({"train/timeout_s": 30}, {"resolve_config"}),
        # A speed knob: score.txt is byte-identical at any batch size.
        ({"score/batch_size": 7}, {"resolve_config"}),
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
        # Library modules reach every stage that imports them (kws.sourcecode), declared by no list.
        ("kws/distributed.py", TRAIN_ONWARD - {"resolve_config"}),
        ("kws/loss.py", TRAIN_ONWARD - {"resolve_config"}),
        ("kws/det.py", {"compute_det", "plot_det", "plot_training", "export_model"}),
        # the phoneme check is read at inference only: an edit rescores, never retrains
        ("kws/phone_check.py", {"score", "compute_det", "plot_det", "export_model"}),
    ],
)
def test_an_edited_script_reruns_its_stage_onward(completed_run, script, expected):
    planned = planned_after_an_edit(completed_run, script)
    planned.pop("all", None)
    assert set(planned) == expected


def planned_after_an_edit(root, relative):
    """The jobs a dry run plans with a comment appended to `relative` (then restored)."""
    path = root / relative
    original = path.read_text()
    path.write_text(original + "\n# edited\n")
    try:
        return planned_jobs(snakemake(root, "-n"))
    finally:
        path.write_text(original)


@pytest.mark.slow
def test_listing_more_seeds_trains_only_the_new_seed_and_compares_the_seeds(completed_run):
    # the run of train.seed keeps its folder and its model; seed 1 trains beside it; the comparison gets both
    write_config(completed_run, with_changes(**{"experiments/tiny/seeds": [666, 1]}))
    try:
        result = snakemake(completed_run, "-n", "--printshellcmds")
    finally:
        write_config(completed_run, TINY_CONFIG)
    planned = planned_jobs(result)
    assert planned["train"] == 1 and planned["compare_experiments"] == 1 and planned["export_model"] == 1
    train = [line for line in result.stdout.splitlines() if "--model_dir" in line]
    assert len(train) == 1 and "--model_dir results/tiny-seed1/model" in train[0] and "--seed 1 " in train[0]
    assert "--experiments tiny tiny" in result.stdout and "--names tiny tiny-seed1" in result.stdout


def test_seeds_are_compared_on_the_heldout_engine_too(tmp_path):
    """With corpus.heldout_engine, the comparison reads every run's test_engine metrics beside test's."""
    make_workdir(tmp_path, with_changes(**{"experiments/tiny/seeds": [666, 1], "corpus/heldout_engine": "mbrola"}))
    result = snakemake(tmp_path, "-n", "--printshellcmds")
    assert result.returncode == 0, result.stderr[-3000:]
    heldout = "results/tiny/test_engine/metrics.json results/tiny-seed1/test_engine/metrics.json"
    assert f"--heldout-metrics {heldout} --heldout-split test_engine" in result.stdout


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


@pytest.mark.slow
def test_an_edited_config_module_reruns_training_and_the_stages_that_import_it(completed_run):
    planned = planned_after_an_edit(completed_run, "kws/config.py")
    assert {"resolve_config", "train", "average_model", "score", "export_model"} <= set(planned)


@pytest.mark.slow
def test_a_copied_project_folder_is_up_to_date(completed_run, tmp_path):
    """`cp -a` (or rsync to a cluster's scratch) keeps the results: no absolute path in any input."""
    copy_dir = tmp_path / "moved"
    subprocess.run(["cp", "-a", str(completed_run), str(copy_dir)], check=True)
    assert planned_jobs(snakemake(copy_dir, "-n")) == {}


@pytest.mark.slow
def test_the_documented_way_to_retrain_after_deleting_the_model(completed_run, tmp_path):
    """Deleting results/<exp>/model/ alone retrains nothing (Snakemake does not regenerate a missing
    intermediate while the outputs after it are present); --forcerun train does, as config/README says."""
    copy_dir = tmp_path / "deleted"
    subprocess.run(["cp", "-a", str(completed_run), str(copy_dir)], check=True)
    shutil.rmtree(copy_dir / "results" / "tiny" / "model")
    assert planned_jobs(snakemake(copy_dir, "-n")) == {}
    planned = planned_jobs(snakemake(copy_dir, "-n", "--forcerun", "train"))
    assert {"train", "average_model", "score", "compute_det", "export_model"} <= set(planned)
    for doc in ("config/README.md", "docs/TROUBLESHOOTING.md"):
        assert "--forcerun train" in (REPO / doc).read_text(), doc
