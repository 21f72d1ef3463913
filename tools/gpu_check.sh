#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one go, within GPU_CHECK_BUDGET seconds (default 480: the
# next GPU session's device time is 15 minutes with the machine's start) on one H100/H200-class GPU:
#   1. the 124M-parameter reference model, 50 steps with compile and bf16: tokens/s and MFU
#      against the datasheet peak (tools/bench/bench_gpu.py): issue 20's open number, first;
#   2. the tests marked `cuda` (they skip without a GPU), from the files that hold them;
#   3. the main job with its CUDA overlay (configs/quickstart-cuda.yaml: 8 layers, d_model 512,
#      bf16, torch.compile), 1000 steps;
#   4. the main job's CUDA overlay under torchrun on NCCL, one rank (two ranks need two GPUs):
#      FSDP2 saving a DCP checkpoint and resuming from it, then DDP (eager: the compiled path is 3);
#   5. the Muon benchmark at 12 layers x d_model 768 on the GPU (tools/bench/bench_optim.py);
#   6. where the 124M step's GPU time goes by kernel family, what the trainer costs over a bare
#      loop, and what twice the batch, the chunked loss head (model.loss_chunk_size) at the batch
#      and at twice it, CUDA graphs and a bf16 residual stream change
#      (profile_gpu.py --variants; max_autotune is left out: minutes). Last, as the longest: it
#      gets what the budget has left, and writes its JSON after each part it measured.
# Every step runs under its own time limit, cut to what the budget has left (a step with under
# 20 s left is skipped); a failed, timed-out or skipped step does not stop the later ones, and
# the summary ($GPU_CHECK_OUT/summary.txt) lists each step's exit code and seconds.
# GPU_CHECK_DRY_RUN=1 runs nothing (no GPU needed): it prints each command with the limit it
# would get if every step before it used its whole limit (the worst case).
# Results land in $GPU_CHECK_OUT (default tools/bench/results/gpu/); put them in the report with
# `python tools/bench/report.py --write-readme` after copying gpu.json, gpu_profile.json and
# optim_cuda.json next to the other results. On one H200 (torch 2.11) steps 1-5 took 225-281 s,
# before the profile and the CUDA tests' later scenarios joined them.
# It uses the python on PATH and imports the packages from source (no install, no network): that
# python needs torch with CUDA, numpy, pyyaml, tqdm, safetensors, huggingface_hub, matplotlib and
# pytest. Set PYTHON to choose another interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${GPU_CHECK_OUT:-tools/bench/results/gpu}
mkdir -p "$OUT"
src=""
for dir in packages/*/src; do src="$src:$PWD/$dir"; done
export PYTHONPATH="${src#:}:$PWD/tools/bench${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

BUDGET=${GPU_CHECK_BUDGET:-480}
DRY=${GPU_CHECK_DRY_RUN:-0}
GRACE=10  # after a step's limit, SIGTERM; this much later, SIGKILL
if [ "$DRY" = 1 ]; then
  echo "dry run: nothing runs; limits assume every step before used its whole limit"
elif ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA GPU visible to $PYTHON: nothing to check"
  exit 2
else
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'on', torch.cuda.get_device_name(0))"
fi
failed=()
spent=0  # seconds the steps took (in a dry run: their whole limits and grace)
: >"$OUT/summary.txt"
step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep the log, remember failures
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - spent - GRACE))
  [ "$limit" -le "$left" ] || limit=$left
  if [ "$limit" -lt 20 ]; then
    echo "== $name: skipped, $((BUDGET - spent))s of the ${BUDGET}s budget left" | tee -a "$OUT/summary.txt"
    failed+=("$name")
    return
  fi
  echo "== $name (limit ${limit}s)"
  if [ "$DRY" = 1 ]; then
    echo "$*"
    echo "$name limit ${limit}s" >>"$OUT/summary.txt"
    spent=$((spent + limit + GRACE))
    return
  fi
  local start=$SECONDS
  timeout -k "$GRACE" "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local code=${PIPESTATUS[0]} took=$((SECONDS - start))
  spent=$((spent + took))
  echo "== $name: exit $code after ${took}s" | tee -a "$OUT/summary.txt"
  [ "$code" -eq 0 ] || failed+=("$name")
}

step gpu-124m 120 "$PYTHON" tools/bench/bench_gpu.py --out "$OUT/gpu.json"
mapfile -t cuda_tests < <(grep -rl "pytest.mark.cuda" tests --include='test_*.py' | sort)
# -vv (the project's addopts hold -q) names each test as it ends: a step cut short by its limit
# still shows which ones ran, and the durations size this step's limit for the next session.
step cuda-tests 180 "$PYTHON" -m pytest -vv -rs --durations=0 -m cuda -p no:cacheprovider \
  --basetemp=/tmp/gpu-check-pytest "${cuda_tests[@]}"
[ -f data/stdlib/val_000000.bin ] || step prepare 60 "$PYTHON" -m speedtronic prepare data/stdlib
step main-job 150 "$PYTHON" -m speedtronic train configs/quickstart.yaml \
  --cuda-overlay configs/quickstart-cuda.yaml --set run.output_dir="$OUT/quickstart" \
  --set logging.json_file="$OUT/quickstart/metrics.jsonl" --set checkpoint.enabled=false
parallel=(configs/quickstart.yaml --cuda-overlay configs/quickstart-cuda.yaml --nproc-per-node 1
  --set compile=false --set checkpoint.every_steps=50 --set data.eval_every=50)
step fsdp 60 "$PYTHON" -m speedtronic train "${parallel[@]}" --set parallel.data_parallel=fsdp \
  --set run.output_dir="$OUT/fsdp" --max-steps 100
step fsdp-resume 60 "$PYTHON" -m speedtronic train "${parallel[@]}" --resume \
  --set parallel.data_parallel=fsdp --set run.output_dir="$OUT/fsdp" --max-steps 150
step ddp 60 "$PYTHON" -m speedtronic train "${parallel[@]}" --set parallel.data_parallel=ddp \
  --set run.output_dir="$OUT/ddp" --max-steps 100
step muon 90 "$PYTHON" tools/bench/bench_optim.py --full --device cuda --world 1 --repeats 10 \
  --out "$OUT/optim_cuda.json"
step gpu-profile 240 "$PYTHON" tools/bench/profile_gpu.py --out "$OUT/gpu_profile.json" \
  --variants batch_x2 chunked_loss_batch_x2 chunked_loss cuda_graphs bf16_residual

echo "results in $OUT"
cat "$OUT/summary.txt"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed: ${failed[*]}"
  exit 1
fi
