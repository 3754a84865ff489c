"""bench/gpu_session.sh is ready for a lent GPU: the whole session runs on the CPU in its readiness mode (its
knobs at a tiny corpus, batch and sweep), in a private copy of the checkout with every result under tmp,
and leaves what a session's reader relies on: a zero rc in each phase's log, gpu_check.md's rows (the step
alone, the data path, end-to-end training with its 80-epoch projection), sweep.md's run and results.tgz."""

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from workflow_utils import REPO, copy_checkout

PHASES = ("gpu_check", "synth_big", "workflow", "sweep")
ONE_RUN_SWEEP = (
    "name\tcorpus\tseed\taverage\tmodel\toverrides\n"
    "one_epoch\tdefault\t666\t1\tconfig/models/ds_tcn_small.yaml\ttraining_config.max_epoch=1\n"
)
# Minutes of CPU instead of a GPU's ten: a tiny corpus, batch 8, two timed steps, 16 utterances an epoch.
CHECK_ARGS = "--batch 8 --steps 2 --corpus-size tiny --utterances 16 --epochs 2"


def checkout_state():
    """`git status` of the checkout, ignored files included, bytecode caches left out; None outside git."""
    try:
        result = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--ignored", "--untracked-files=all"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    noise = ("__pycache__", ".pytest_cache", ".hypothesis", ".venv/", ".egg-info")
    return {line for line in result.stdout.splitlines() if not any(part in line for part in noise)}


def table_rows(markdown):
    """{first cell: second cell} of a two-column markdown table."""
    rows = {}
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[0] not in ("what", "---"):
            rows[cells[0]] = cells[1]
    return rows


@pytest.mark.slow
def test_gpu_session_runs_on_cpu(tmp_path):
    checkout = copy_checkout(tmp_path / "checkout", extra=("bench",))
    out, results = tmp_path / "out", tmp_path / "results_gpu"
    sweep = tmp_path / "one_run.tsv"
    sweep.write_text(ONE_RUN_SWEEP)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # the copy's kws, not ours
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",  # this python3, snakemake, torchrun
        KWS_GPU_DEVICE="cpu",
        KWS_GPU_SIZE="tiny",
        KWS_GPU_RESULTS=str(results),
        KWS_GPU_SWEEP=str(sweep),
        KWS_GPU_CHECK_ARGS=CHECK_ARGS,
        # The GPU budget's limits (150, 180, 300 s) would fail a slow shared CPU; here they only stop a hang.
        KWS_GPU_CHECK_TIMEOUT="600",
        KWS_GPU_WORKFLOW_TIMEOUT="600",
        KWS_SWEEP_DEADLINE="600",
    )
    before = checkout_state()
    session = subprocess.run(
        ["bash", "bench/gpu_session.sh", str(out)], cwd=checkout, env=env, capture_output=True, text=True, timeout=2400
    )
    assert session.returncode == 0, session.stderr[-3000:]

    for phase in PHASES:
        log = (out / f"{phase}.log").read_text()
        assert re.search(rf"^{phase} rc 0 in \d+ s$", log, re.M), f"{phase}.log:\n{log[-3000:]}"

    rows = table_rows((out / "gpu_check.md").read_text())
    assert not [row for row, figure in rows.items() if figure.startswith("failed")], rows
    step = "ds_tcn.yaml (287 K) step, batch 8 x 200"
    for mode in ("fp32", "bf16"):
        assert re.fullmatch(r"\d+ utt/s", rows[f"{step}, {mode}"]), rows
    assert rows[f"{step}, compile"] == "skipped on CPU"
    for how in ("store on the device", "host batches, pinned and prefetched"):
        loader = rows[f"data path alone (ds_tcn.yaml features), batch 8, {how}"]
        assert re.fullmatch(r"\d+ utt/s = [\d.]+x the best eager step", loader)
    assert rows["features of batches gathered on the device equal host batches'"].startswith("yes ")
    training = re.compile(
        r"end-to-end training \(torchrun, train.py\), (?P<model>.+), batch 8, (?P<precision>\w+)"
        r"(?P<sorted>, sort \+ stratify \(sort_size 2560\))?"
    )
    padded = {}  # (model, sorted) -> mean padded frames of its batches
    for what, figure in rows.items():
        if match := training.fullmatch(what):
            precision = match["precision"]
            assert rows[f"{match['model']} step, batch 8 x 200, {precision}"], rows  # what the ratios divide by
            shape = re.fullmatch(
                rf"\d+ utt/s \(epochs 2 of 16 utterances of [\d.]+ s on average, CV included; batches padded to "
                rf"(\d+) frames on average, [\d.]+x the real frames\) = [\d.]+x the {precision} step alone in "
                r"utterances, [\d.]+x in padded frames; projected 80 epochs x 130,000 utterances: [\d.]+ (h|min)",
                figure,
            )
            assert shape, figure
            padded[match["model"], bool(match["sorted"])] = int(shape[1])
    # one unsorted and one sorted row per model, in the precision the trainer resolved on this CPU; sorting
    # pads no more than shuffling
    models = ("ds_tcn.yaml (287 K)", "ds_tcn_small.yaml (115 K)")
    assert sorted(padded) == sorted((model, how) for model in models for how in (False, True)), rows
    for model in models:
        assert padded[model, True] <= padded[model, False], padded

    sweep_md = (out / "sweep.md").read_text()
    assert re.search(r"^\| one_epoch \| default \| 666 \| .* \| done in \d+ s \| [\d.]+ \|", sweep_md, re.M), sweep_md

    with tarfile.open(out / "results.tgz") as archive:
        names = archive.getnames()
    for expected in ("ds_tcn_small_gpu/metrics.json", "sweep/one_epoch/det/stats.hi_xiaowen.txt"):
        assert any(name.endswith(expected) for name in names), names
    # what would not come back from a lease (16 MiB a file): the audio stores, per-window scores
    assert not [name for name in names if "/audio/" in name or name.endswith("score.txt")], names
    assert checkout_state() == before, "the session wrote into the checkout"
