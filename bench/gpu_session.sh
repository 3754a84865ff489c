#!/usr/bin/env bash
# One session on a lent CUDA machine (about 9 minutes: phases capped at 180, 300 and 100 s), from the repository root:
#
#   bash bench/gpu_session.sh OUT_DIR
#
# 1. The workflow itself on the GPU: `snakemake --resources gpu=1` with bench/gpu_config.yaml (default
#    corpus, default model trained by one NCCL rank through the GPU lock wrapper, scored on the GPU,
#    exported), timed.
# 2. A recipe sweep for the default model (bench/gpu_sweep.tsv), all runs at once on the one GPU, each
#    scored on the default held-out test split: run-to-run spread (seeds) and what more training data
#    or a larger model buys. Also the training split made 4x larger (same dev/test split: the plan draws
#    each split from its own random stream).
# 3. bench/gpu_check.py's step throughput (fp32, bf16, compile) and loader figures, last, so that the
#    sweep does not disturb them.
#
# The machine has no network: snakemake, soundfile and espeakng-loader come as wheels in .whl/ when
# present (see bench/results.md, "GPU session"). Everything lands in OUT_DIR: a log per phase and
# results.tgz with the metrics, DET stats and training logs.
set -uo pipefail
out=${1:?usage: bash bench/gpu_session.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 KWS_SWEEP_DEADLINE=${KWS_SWEEP_DEADLINE:-300}
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PATH=/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
results=${KWS_GPU_RESULTS:-results_gpu}
size=${KWS_GPU_SIZE:-default}
device=${KWS_GPU_DEVICE:-cuda}
{ date; nvidia-smi -L; python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"; nproc; } \
    > "$out/env.txt" 2>&1

# The 4x training split, synthesised in the background while the workflow runs (CPU only).
train_big=$(python3 -c "from kws.synth import SIZES; print(4 * SIZES['$size']['train'])")
python3 scripts/synthesize_corpus.py --out-dir "$results/big" --size "$size" --train-utterances "$train_big" \
    --threads 6 > "$out/synth_big.log" 2>&1 &
synth_pid=$!

# 1. the workflow on the GPU
gpu=$([ "$device" = cuda ] && echo 1 || echo 0)
printf 'results_dir: %s\ncorpus: {size: %s}\nscore: {gpu: %s}\nexperiments: {ds_tcn_small_gpu: {gpus: %s}}\n' \
    "$results" "$size" "$gpu" "$gpu" > "$out/overlay.yaml"
begin=$(date +%s)
timeout 180 snakemake --cores 16 --resources gpu=1 --configfile bench/gpu_config.yaml "$out/overlay.yaml" \
    --set-threads synthesize_corpus=8 -- "$results/ds_tcn_small_gpu/metrics.json" \
    "$results/ds_tcn_small_gpu/export/model.onnx" > "$out/workflow.log" 2>&1
echo "workflow rc $? in $(( $(date +%s) - begin )) s" | tee -a "$out/workflow.log"

# 2. the sweep
wait "$synth_pid"
python3 bench/gpu_sweep.py --results "$results" --device "$device" --sweep bench/gpu_sweep.tsv \
    --deadline "$KWS_SWEEP_DEADLINE" --out "$out/sweep.md" > "$out/sweep.log" 2>&1
echo "sweep rc $?" >> "$out/sweep.log"

# 3. step throughput and loader (the torchrun epoch is phase 1's training)
timeout 100 python3 bench/gpu_check.py --device "$device" --no-torchrun --out "$out/gpu_check.md" \
    > "$out/gpu_check.log" 2>&1
echo "gpu_check rc $?" >> "$out/gpu_check.log"

tar czf "$out/results.tgz" --exclude='*/model/*.pt' --exclude='*.wav' --exclude='*.onnx' --exclude='data' \
    --exclude='features' "$results" 2>/dev/null
date >> "$out/env.txt"
