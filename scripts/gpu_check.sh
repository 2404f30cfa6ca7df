#!/usr/bin/env bash
# Every GPU check of the project, from a plain checkout (PYTHONPATH=., no install):
#   bash scripts/gpu_check.sh                    # every step, in the order below
#   bash scripts/gpu_check.sh targets telemetry  # only the steps named (any order given is kept)
#   bash scripts/gpu_check.sh --list             # the steps, one line each
#   CHECK_DEVICE=cpu bash scripts/gpu_check.sh quick   # dry run of a step on a CPU machine
# A lent GPU machine allows 10 minutes a call and 30 minutes a session: the steps are ordered
# by what they prove (the performance targets and telemetry first), and --list gives each step's
# planned minutes on an H100 (a guess for splitting a session into calls, not a measurement:
# the summary at the end prints each step's measured seconds, which replace the guesses). The calibration cache lives
# in runs/gpu-check-cache of the checkout (ignored by git, so it stays on a warm machine between
# calls even where each call gets a fresh $OUT); it is keyed by GPU and build, so a cache from
# another machine is never used.
# Writes under $OUT: env.json, calibration.json, runs/, report/ (the sample report of the
# targets run), find-batch.json, and a log per step. It changes no GPU setting (clocks, power
# limits, MIG): it only runs training.
set -uo pipefail
cd "$(dirname "$0")/.."
# absolute: tests start gpubench from their own temporary directories
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-gpu-check-out}
DEV=${CHECK_DEVICE:-cuda}
PY=${PYTHON:-python3}
export GPUBENCH_CACHE_DIR=${GPUBENCH_CACHE_DIR:-$PWD/runs/gpu-check-cache}
mkdir -p "$OUT"
status=0
cuda() { [ "$DEV" = cuda ]; }
step() {  # step NAME CMD...: run, tee the log, remember a failure, keep going
  local name=$1; shift
  echo "=== $name: $*"
  local start=$SECONDS
  "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc"
  summary+=("$name: exit $rc, $((SECONDS - start)) s ($OUT/$name.log)")
  [ "$rc" -eq 0 ] || status=1
}
summary=()
run() { "$PY" -m gpubench run "$@" --out "$OUT/runs" --no-report; }
latest_run() { ls -td "$OUT"/runs/"$1"-* 2>/dev/null | head -n 1; }  # latest_run SUITE_NAME

# --- the steps: NAME, planned minutes on an H100 (a guess), what it checks ---------------------
STEPS=(
  "env         0  the machine: nvidia-smi, gpubench env"
  "calibrate   1  (39 s on an H100, 2026-11-24): peak TFLOP/s per precision (best training kernel) and copy bandwidth (cached for MFU)"
  "targets     6  (318 s): ResNet-50 / MNIST CNN target configs, checked by scripts/gpu_targets.py; sample report"
  "telemetry   2  (75 s): utilisation busy/idle, power above idle, counter vs integrated energy; NVML overhead"
  "quick       4  (216 s): the quick suite's CUDA configs at fp32, tf32, amp-fp16, amp-bf16"
  "jax         6  (138 s + 7 of 10 targets in 200 s on an H200): JAX beside PyTorch on one GPU: the quick suite's CNN and MLP, and the targets' CNN and ResNet-50 (eager, contiguous)"
  "transformer 5  GPT-2 small's shape at amp-bf16 in PyTorch and JAX with every attention kernel (tokens/s, MFU: compared with nanoGPT's and llm.c's in docs/gpu-validation.md); ViT-B/16"
  "fsdp        5  a 1.3B-parameter GPT at amp-bf16 near the GPU's memory: single, ddp:1, fsdp:1 (both reshard settings), tp:1 and fsdp:1+tp:1 over NCCL: state and allocator peak per device"
  "overhead    1  (30 s): harness overhead against a hand-written loop"
  "parallel    5  (237 s for 13 of 16 configs): grad-accum:4, ddp:1 and pipeline:1 over NCCL against single"
  "compile     6  eager, torch.compile, reduce-overhead, cuda-graph, channels-last on the MNIST CNN"
  "resnet      4  (190 s): ResNet-18/50 with and without activation checkpointing (memory saving)"
  "profile     1  (33 s): gpubench profile (CUDA kernels, breakdown on CUDA events; NVTX under nsys if installed; the allocator history of an ok and an oom config)"
  "advise      6  gpubench advise on the MNIST CNN (every practice, compile included) and ResNet-50 (compile left out), fp32 eager baselines"
  "gpu-tests   6  (303 s) every @pytest.mark.gpu test"
  "find-batch  5  the largest batch for cnn and mlp at amp-bf16 (expected to fit to the limit), and for ResNet-18 fp32 (chosen to run out of memory partway)"
  "max-batch   3  (136 s): batch_size = \"max\" resolved before the config runs; a config past the GPU's memory ends oom"
)

do_env() {
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  "$PY" -m gpubench env --json > "$OUT/env.json" || return 1
  "$PY" - "$OUT/env.json" <<'PYEOF'
import json, sys
env = json.load(open(sys.argv[1]))
t = env["frameworks"].get("torch", {})
print("gpus:", [(g["name"], g["driver"], g["cuda_driver"]) for g in env["gpus"]] or env["nvml_reason"])
print("torch:", t.get("version"), t.get("build"), "python", env["python"], "cpu", env["cpu_model"])
PYEOF
}

do_calibrate() {
  step calibrate "$PY" -m gpubench calibrate --device "$DEV" --force --json "$OUT/calibration.json"
}

do_targets() {  # the configs of the GPU performance targets, then the verdicts and a report
  local sets=()
  cuda || sets=(--set device=cpu --set workload=cnn --set batch_size=16 --set compile=none --set steps=2
                --set windows=2 --set precision=amp-bf16)
  # this machine's calibration (from the cache, which is keyed by GPU and build, when the
  # calibrate step ran; measured now otherwise), never a calibration.json of another machine
  step calibration "$PY" -m gpubench calibrate --device "$DEV" --json "$OUT/calibration.json"
  step targets-run run suites/gpu-targets.toml "${sets[@]}"
  local dir
  dir=$(latest_run gpu-targets)
  [ -n "$dir" ] || { echo "no gpu-targets run directory"; status=1; return; }
  step targets "$PY" scripts/gpu_targets.py --calibration "$OUT/calibration.json" "$dir"
  step targets-report "$PY" -m gpubench report "$dir" --out "$OUT/report"
}

do_telemetry() {
  step telemetry "$PY" scripts/telemetry_check.py --device "$DEV" --out "$OUT/telemetry-runs" --python "$PY"
  step telemetry-overhead "$PY" benchmarks/overhead.py --telemetry --device "$DEV" --json "$OUT/telemetry-overhead.json"
}

do_quick() {
  if cuda; then local p=fp32,tf32,amp-fp16,amp-bf16 s=50; else local p=fp32,amp-bf16 s=2; fi
  step quick run suites/quick.toml --set framework=torch --set device="$DEV" --set precision="$p" \
    --set batch_size=128,512 --set warmup_steps=10 --set steps="$s" --set windows=5
}

do_jax() {  # the first cross-framework table on a GPU: the GPU images carry JAX (with CUDA), not TensorFlow
  if cuda; then local p=fp32,tf32,amp-bf16 s=50; else local p=fp32 s=2; fi
  step jax-quick run suites/quick.toml --set framework=torch,jax --set device="$DEV" --set precision="$p" \
    --set batch_size=256 --set warmup_steps=10 --set steps="$s" --set windows=5
  local sets=()
  cuda || sets=(--set device=cpu --set workload=cnn --set batch_size=16 --set steps=2 --set windows=2
                --set precision=fp32)
  step jax-targets run suites/gpu-targets.toml --set framework=torch,jax --set compile=none \
    --set memory_format=contiguous "${sets[@]}"
}

do_transformer() {  # the transformers on a GPU: GPT-2 small (124M, 1024 tokens) and ViT-B/16, PyTorch and JAX
  if cuda; then
    local p=amp-bf16 s=20
    local gpt=(--set layers=12 --set d_model=768 --set heads=12 --set seq_len=1024 --set vocab=50257
               --set batch_size=8)
    local vit=(--set image=224 --set patch=16 --set layers=12 --set d_model=768 --set heads=12 --set classes=1000
               --set batch_size=64)
  else
    local p=fp32 s=2
    local gpt=(--set layers=1 --set d_model=32 --set heads=2 --set seq_len=16 --set vocab=64 --set batch_size=4)
    local vit=(--set layers=1 --set d_model=32 --set heads=2 --set batch_size=4)
  fi
  # every attention kernel: what a framework or device lacks is recorded unsupported, without a process
  step transformer-gpt run suites/transformer.toml --set workload=gpt --set framework=torch,jax \
    --set device="$DEV" --set precision="$p" --set attention=sdpa,math,flash,efficient,cudnn "${gpt[@]}" \
    --set warmup_steps=5 --set steps="$s" --set windows=3
  step transformer-vit run suites/transformer.toml --set workload=vit --set framework=torch,jax \
    --set device="$DEV" --set precision="$p" "${vit[@]}" --set warmup_steps=5 --set steps="$s" --set windows=3
}

do_fsdp() {  # sharding on one GPU: FSDP2 and DTensor over NCCL, the memory of a model near the GPU's limit
  if cuda; then
    local p=amp-bf16 s=5
    local gpt=(--set layers=24 --set d_model=2048 --set heads=16 --set seq_len=1024 --set vocab=50257
               --set batch_size=4)
  else
    local p=fp32 s=2
    local gpt=(--set layers=2 --set d_model=32 --set heads=4 --set seq_len=16 --set vocab=64 --set batch_size=4)
  fi
  step fsdp run suites/transformer.toml --set workload=gpt --set framework=torch --set device="$DEV" \
    --set precision="$p" --set attention=sdpa --set parallelism=single,ddp:1,fsdp:1,tp:1,fsdp:1+tp:1 "${gpt[@]}" \
    --set warmup_steps=2 --set steps="$s" --set windows=2
  step fsdp-reshard run suites/transformer.toml --set workload=gpt --set framework=torch --set device="$DEV" \
    --set precision="$p" --set attention=sdpa --set parallelism=fsdp:1 --set fsdp_reshard=after-backward \
    "${gpt[@]}" --set warmup_steps=2 --set steps="$s" --set windows=2
}

do_overhead() {
  step overhead "$PY" benchmarks/overhead.py --device "$DEV" --json "$OUT/overhead.json"
}

do_parallel() {
  local s=2; cuda && s=50
  step parallel run suites/parallel.toml --set framework=torch --set device="$DEV" --set precision=fp32,amp-bf16 \
    --set batch_size=128 --set parallelism=single,grad-accum:4,ddp:1,pipeline:1 \
    --set steps="$s" --set windows=5
}

do_compile() {  # torch-compile-max-autotune left out: its autotuning takes minutes per config
  if cuda; then local s=20 c=none,torch-compile,torch-compile-reduce-overhead,cuda-graph
  else local s=2 c=none,torch-compile; fi
  step compile run suites/compile.toml --set framework=torch --set device="$DEV" --set precision=fp32,amp-bf16 \
    --set compile="$c" --set steps="$s"
}

do_resnet() {
  local sets=(--set steps=20)
  cuda || sets=(--set workload=resnet18 --set batch_size=8 --set steps=2)
  step resnet run suites/resnet.toml --set framework=torch --set device="$DEV" "${sets[@]}"
}

do_profile() {
  step profile "$PY" -m gpubench profile suites/quick.toml --out "$OUT/runs" --no-report --set framework=torch \
    --set device="$DEV" --set workload=cnn --set batch_size=128 --set precision=fp32,amp-bf16 --steps 10
  # the allocator's history (a CUDA path) on an ok config and on one far past the GPU's memory
  step memory-history "$PY" -m gpubench profile suites/quick.toml --out "$OUT/runs" --no-report \
    --set framework=torch --set device="$DEV" --set workload=cnn --set batch_size=128,4194304 --set precision=fp32 \
    --steps 3 --memory-history
  if command -v nsys >/dev/null && cuda; then
    step nsys nsys profile --trace=cuda,nvtx --force-overwrite=true -o "$OUT/profile-nsys" \
      "$PY" -m gpubench profile suites/quick.toml --out "$OUT/runs" --no-report --set framework=torch \
      --set device=cuda --set workload=cnn --set batch_size=128 --set precision=fp32 --steps 5
    step nsys-nvtx nsys stats --report nvtx_sum "$OUT/profile-nsys.nsys-rep"
  fi
}

do_advise() {  # the practices measured on the GPU: the CNN's and ResNet-50's advice for docs/gpu-validation.md
  local cnn=(--budget 150) r50=(--set workload=resnet50 --budget 180)
  cuda || { cnn=(--budget 20 --only optimizer --set steps=2); r50=(--set workload=resnet18 --set batch_size=8
    --set steps=2 --budget 20 --only optimizer); }
  step advise-cnn "$PY" -m gpubench advise suites/compile.toml --out "$OUT/runs" --no-report --set framework=torch \
    --set device="$DEV" --set precision=fp32 --set compile=none --set memory_format=contiguous "${cnn[@]}" \
    --markdown "$OUT/advise-cnn.md"
  step advise-resnet50 "$PY" -m gpubench advise suites/resnet.toml --out "$OUT/runs" --no-report \
    --set framework=torch --set device="$DEV" --set precision=fp32 --set checkpointing=none --skip compile \
    "${r50[@]}" --markdown "$OUT/advise-resnet50.md"
}

do_gpu_tests() {
  step gpu-tests "$PY" -m pytest -q -rs -m gpu tests/
}

do_find_batch() {
  local limit=512; cuda && limit=32768  # up to 8 fresh-process probes per config: one call
  step find-batch "$PY" -m gpubench find-batch suites/quick.toml --set framework=torch --set device="$DEV" \
    --set precision=amp-bf16 --set batch_size=256 --limit "$limit" --json "$OUT/find-batch.json"
  # one search that runs out of memory partway (ResNet-18 fp32 needs ~10 MB a sample): the
  # oom -> bisection path on a real GPU
  local start=1024; cuda || { start=8; limit=32; }
  step find-batch-oom "$PY" -m gpubench find-batch suites/resnet.toml --set framework=torch --set device="$DEV" \
    --set workload=resnet18 --set precision=fp32 --set checkpointing=none --set batch_size="$start" \
    --limit "$limit" --json "$OUT/find-batch-oom.json"
}

do_max_batch() {
  if cuda; then local start=1024 limit=16384; else local start=32 limit=128; fi
  step max-batch run suites/quick.toml --set framework=torch --set device="$DEV" --set workload=cnn \
    --set precision=amp-bf16 --set batch_size=max --set max_batch_start="$start" --set max_batch_limit="$limit" \
    --set steps=5 --set windows=3
  # a real out-of-memory (ResNet-50 fp32 at batch 4096 needs far more than 80 or 141 GB): status oom
  local bs=4096; cuda || bs=8
  step oom-run run suites/resnet.toml --set framework=torch --set device="$DEV" --set workload=resnet50 \
    --set precision=fp32 --set checkpointing=none --set batch_size="$bs" --set warmup_steps=1 --set steps=1 \
    --set windows=1 --no-calibrate
  local dir
  dir=$(latest_run resnet)
  step oom-status "$PY" - "$dir" "$DEV" <<'PYEOF'
import json, sys
from pathlib import Path
(r,) = [json.loads(l) for l in (Path(sys.argv[1]) / "results.jsonl").read_text().splitlines()]
print(r["config_id"], r["status"], r["reason"])
sys.exit(0 if r["status"] == ("oom" if sys.argv[2] == "cuda" else "ok") else 1)
PYEOF
}

names=()
for s in "${STEPS[@]}"; do names+=("${s%% *}"); done
if [ "${1:-}" = --list ]; then echo "step        planned minutes on an H100 (measured seconds in brackets where a GPU has run it)"; printf '%s\n' "${STEPS[@]}"; exit 0; fi
chosen=("$@")
[ ${#chosen[@]} -gt 0 ] || chosen=("${names[@]}")
for name in "${chosen[@]}"; do
  if [[ ! " ${names[*]} " == *" $name "* ]]; then
    echo "gpu_check.sh: unknown step '$name'; expected one of: ${names[*]}" >&2
    exit 2
  fi
done
[[ " ${chosen[*]} " == *" env "* ]] || do_env  # every call records the machine
for name in "${chosen[@]}"; do
  "do_${name//-/_}" || status=1
done
# a compact summary last, so the tail of a long call's output still says what passed
echo "=== summary"
[ ${#summary[@]} -eq 0 ] || printf '  %s\n' "${summary[@]}"
echo "=== done: status $status, outputs in $OUT"
exit $status
