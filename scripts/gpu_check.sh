#!/usr/bin/env bash
# Every GPU check of the project in one call (device time is short), from a plain checkout:
#   bash scripts/gpu_check.sh              # on the GPU machine, from the repo root
#   CHECK_DEVICE=cpu bash scripts/gpu_check.sh   # dry run of this script on a CPU machine
# Writes everything under $OUT (default ./gpu-check-out): env.json, the run directory,
# overhead JSON, and a log of each step. Prints the figures that go into docs/gpu-validation.md.
# It changes no GPU setting (clocks, power limits, MIG): it only runs training.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-gpu-check-out}
DEV=${CHECK_DEVICE:-cuda}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
status=0
step() {  # step NAME CMD...: run, tee the log, remember a failure, keep going
  local name=$1; shift
  echo "=== $name: $*"
  "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc"
  [ "$rc" -eq 0 ] || status=1
}

date -u +"date: %Y-%m-%dT%H:%M:%SZ"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
"$PY" -m gpubench env --json > "$OUT/env.json" || status=1
"$PY" - "$OUT/env.json" <<'PYEOF'
import json, sys
env = json.load(open(sys.argv[1]))
t = env["frameworks"].get("torch", {})
print("gpus:", [(g["name"], g["driver"], g["cuda_driver"]) for g in env["gpus"]] or env["nvml_reason"])
print("torch:", t.get("version"), t.get("build"), "python", env["python"], "cpu", env["cpu_model"])
PYEOF

# 0. device peaks (issue #8): matmul TFLOP/s per precision and copy bandwidth, measured again
#    (--force) and cached in $OUT/cache, so the runs below report MFU against them
export GPUBENCH_CACHE_DIR=${GPUBENCH_CACHE_DIR:-$OUT/cache}
step calibrate "$PY" -m gpubench calibrate --device "$DEV" --force --json "$OUT/calibration.json"

# 1. the quick suite's CUDA configs at every precision, batch 128 and 512, longer windows
if [ "$DEV" = cuda ]; then precisions=fp32,tf32,amp-fp16,amp-bf16; steps=50; else precisions=fp32,amp-bf16; steps=2; fi
step quick "$PY" -m gpubench run suites/quick.toml --out "$OUT/runs" --no-report \
  --set framework=torch --set device="$DEV" --set precision="$precisions" --set batch_size=128,512 \
  --set warmup_steps=10 --set steps="$steps" --set windows=5

# 2. harness overhead against a hand-written loop
step overhead "$PY" benchmarks/overhead.py --device "$DEV" --json "$OUT/overhead.json"

# 3. telemetry: utilisation high while measuring and low idle, power above idle, counter
#    energy vs integrated power within 10% (issue #4); and its cost on throughput
step telemetry "$PY" scripts/telemetry_check.py --device "$DEV" --out "$OUT/telemetry-runs" --python "$PY"
step telemetry-overhead "$PY" benchmarks/overhead.py --telemetry --device "$DEV" --json "$OUT/telemetry-overhead.json"

# 4. parallel strategies on the GPU: grad-accum, ddp:1 and pipeline:1 over NCCL against single,
#    and ddp:2 / pipeline:2 (unavailable with one GPU) (issue #7)
if [ "$DEV" = cuda ]; then psteps=50; else psteps=2; fi
step parallel "$PY" -m gpubench run suites/parallel.toml --out "$OUT/runs" --no-report \
  --set framework=torch --set device="$DEV" --set precision=fp32,amp-bf16 --set batch_size=128 \
  --set parallelism=single,grad-accum:4,ddp:1,pipeline:1,ddp:2,pipeline:2 --set steps="$psteps" --set windows=5

# 4b. compile settings and channels-last (issue #8): eager, torch.compile, Inductor's CUDA
#     graphs, the whole step as one CUDA graph (torch-compile-max-autotune left out: its
#     autotuning takes minutes per config)
if [ "$DEV" = cuda ]; then csteps=20; ccompile=none,torch-compile,torch-compile-reduce-overhead,cuda-graph
else csteps=2; ccompile=none,torch-compile; fi
step compile "$PY" -m gpubench run suites/compile.toml --out "$OUT/runs" --no-report \
  --set framework=torch --set device="$DEV" --set precision=fp32,amp-bf16 --set compile="$ccompile" \
  --set steps="$csteps"

# 4c. gpubench profile: torch.profiler with CUDA kernels, the breakdown on CUDA events; under
#     Nsight Systems (when installed) the NVTX ranges of the warm-up, windows and steps
step profile "$PY" -m gpubench profile suites/quick.toml --out "$OUT/runs" --no-report --set framework=torch \
  --set device="$DEV" --set workload=cnn --set batch_size=128 --set precision=fp32,amp-bf16 --steps 10
if command -v nsys >/dev/null && [ "$DEV" = cuda ]; then
  step nsys nsys profile --trace=cuda,nvtx --force-overwrite=true -o "$OUT/profile-nsys" \
    "$PY" -m gpubench profile suites/quick.toml --out "$OUT/runs" --no-report --set framework=torch \
    --set device=cuda --set workload=cnn --set batch_size=128 --set precision=fp32 --steps 5
  step nsys-nvtx nsys stats --report nvtx_sum "$OUT/profile-nsys.nsys-rep"
fi

# 4b. ResNet-18 and ResNet-50 with and without activation checkpointing (issues #7, #8): each
#     checkpointed result records its peak memory and slowdown against the one without
if [ "$DEV" = cuda ]; then rsets=(--set steps=20); else rsets=(--set workload=resnet18 --set batch_size=8 --set steps=2); fi
step resnet "$PY" -m gpubench run suites/resnet.toml --out "$OUT/runs" --no-report \
  --set framework=torch --set device="$DEV" "${rsets[@]}"

# 5. the GPU tests (skip themselves without CUDA)
step gpu-tests "$PY" -m pytest -q -m gpu tests/

# 6. the largest batch that fits, cnn and mlp at fp32 and amp-bf16 (issue #7; last: it is the
#    longest step, a fresh process per probe)
if [ "$DEV" = cuda ]; then flimit=131072; else flimit=512; fi
step find-batch "$PY" -m gpubench find-batch suites/quick.toml --set framework=torch --set device="$DEV" \
  --set precision=fp32,amp-bf16 --set batch_size=256 --limit "$flimit" --json "$OUT/find-batch.json"

# 7. batch_size = "max": the search before the config, then the config at the batch found (issue #7)
if [ "$DEV" = cuda ]; then mstart=1024; mlimit=16384; else mstart=32; mlimit=128; fi
step max-batch "$PY" -m gpubench run suites/quick.toml --out "$OUT/runs" --no-report --set framework=torch \
  --set device="$DEV" --set workload=cnn --set precision=amp-bf16 --set batch_size=max \
  --set max_batch_start="$mstart" --set max_batch_limit="$mlimit" --set steps=5 --set windows=3

echo "=== done: status $status, outputs in $OUT"
exit $status
