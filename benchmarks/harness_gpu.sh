#!/usr/bin/env bash
# GPU validation harness, one prepared run (SPEC section 7).
#
#   bash benchmarks/harness_gpu.sh          # on a machine with a CUDA GPU (e.g. one H200)
#   bash benchmarks/harness_gpu.sh cpu      # the same steps on the CPU at small sizes
#
# 1. profile: one MoE layer's expert FFNs (SwiGLU) timed at tile boundaries and, with
#    --dense, at every n; the profile file records both samplings' times and the step
#    function's error vs the dense sweep; rows = emulated GPUs at the speeds below.
# 2. validate: linear, greedy and (once registered) gem solved on the bundled instance with
#    that profile as the model, then run as G emulated GPUs on this one device;
#    measured vs modelled straggler latency and whether the ranking agrees.
# Writes instances/profiles/<name>.yaml and benchmarks/results/harness-<mode>.{json,md}.
# Expected time: GPU well under 5 minutes; CPU about a minute.
#
# Override with environment variables: INSTANCE, SPEEDS, D_MODEL, D_FF, DTYPE, MAX_TOKENS,
# TILE, REPEATS, STATISTIC, PROFILE_NAME.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE="${1:-gpu}"
INSTANCE="${INSTANCE:-instances/quickstart.yaml}"   # 2 layers x 16 experts, top-2, 4 GPUs
# emulated speeds of the 4 GPUs: a medium-variability cluster (+-15 %)
SPEEDS="${SPEEDS:-1.12,0.97,0.88,1.05}"
EXPERTS_PER_GPU="${EXPERTS_PER_GPU:-4}"             # E / G of the instance

if [ "$MODE" = "gpu" ]; then
  DEVICE=cuda
  D_MODEL="${D_MODEL:-4096}"; D_FF="${D_FF:-14336}"; DTYPE="${DTYPE:-bf16}"   # Mixtral-8x7B experts
  MAX_TOKENS="${MAX_TOKENS:-2048}"; TILE="${TILE:-64}"; REPEATS="${REPEATS:-10}"
  PROFILE_NAME="${PROFILE_NAME:-gpu-mixtral-bf16}"; STATISTIC="${STATISTIC:-median}"
  LABEL="Measured on a GPU"
  python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: run with cpu')"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv || true
elif [ "$MODE" = "cpu" ]; then
  DEVICE=cpu
  D_MODEL="${D_MODEL:-256}"; D_FF="${D_FF:-512}"; DTYPE="${DTYPE:-fp32}"
  MAX_TOKENS="${MAX_TOKENS:-512}"; TILE="${TILE:-32}"; REPEATS="${REPEATS:-5}"
  # min of the runs: this CPU is shared with other jobs, and preemption only adds time
  PROFILE_NAME="${PROFILE_NAME:-cpu-small}"; STATISTIC="${STATISTIC:-min}"
  LABEL="CPU run (no GPU was available): small FFN sizes, 1 torch thread; checks the harness, not GPU behaviour"
else
  echo "usage: $0 [gpu|cpu]" >&2
  exit 2
fi

PROFILE="instances/profiles/${PROFILE_NAME}.yaml"
REPORT="benchmarks/results/harness-${MODE}.json"
MARKDOWN="benchmarks/results/harness-${MODE}.md"
mkdir -p instances/profiles benchmarks/results
SIZE=(--device "$DEVICE" --d-model "$D_MODEL" --d-ff "$D_FF" --dtype "$DTYPE" --statistic "$STATISTIC")

echo "== 1. profile (tile vs dense) on $DEVICE"
time python -m moeopt profile "${SIZE[@]}" --experts-per-gpu "$EXPERTS_PER_GPU" \
  --max-tokens "$MAX_TOKENS" --tile "$TILE" --dense --repeats "$REPEATS" --warmup 3 \
  --speeds "$SPEEDS" --output "$PROFILE" --quiet

echo "== 2. validate linear / greedy / gem on $INSTANCE"
time python -m moeopt validate "$INSTANCE" "${SIZE[@]}" --profile "$PROFILE" \
  --repeats "$REPEATS" --warmup 2 --report "$REPORT" --quiet

python benchmarks/harness_report.py "$PROFILE" "$REPORT" "$MARKDOWN" --label "$LABEL"
echo "wrote $PROFILE, $REPORT, $MARKDOWN"
