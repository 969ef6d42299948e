#!/usr/bin/env bash
# One device call: per-kernel times (ncu, gpu__time_duration) of a short self-draft bench run,
# split into decode and verify-shaped forwards by tools/ncu_forwards.py — where a verify
# forward's extra time goes. Reuses $BUILD_DIR / $CKPT of scripts/h200_spec.sh when present.
# Then, with COPY=1, runs h200_spec.sh's copy_* runs (training the copy model with $COPY_ARGS).
set -uo pipefail
# shellcheck disable=SC1091
source "$(dirname "$0")/device_lib.sh"
device_setup profile
device_build pagoda cuda_spec_tests
CKPT=${CKPT:-/tmp/llama-1b}
[ -f "$CKPT/config.json" ] || timeout 300 python3 tools/make_checkpoint.py --layout 1b \
  --dtype bf16 --seed 0 --out "$CKPT" > "$R/checkpoint.log" 2>&1
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
SECONDS=0
timeout 240 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
  "$B/pagoda" bench --model "$CKPT" --backend cuda --json --spec draft --spec-steps 3 \
  --spec-topk 1 --spec-draft-tokens 4 --workload random --requests 1 --input-len 256 \
  --output-len 24 --max-running 1 > "$R/ncu.csv" 2> "$R/ncu.err"
echo "ncu rc=$? ${SECONDS}s"
python3 tools/ncu_forwards.py "$R/ncu.csv" | tee "$R/forwards.txt"
if [ "${COPY:-0}" = 1 ]; then
  OUT=$R RUNS="copy_chain copy_b16" bash scripts/h200_spec.sh 2>&1 | grep -v "^\[ " \
    | grep -v "^seed" | cut -c1-900 | tail -14
fi
