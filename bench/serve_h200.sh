#!/usr/bin/env bash
# `pagoda serve` on the lent H200 with the Llama-3.2-1B layout (random weights): builds pagoda
# with CUDA and the server, writes the checkpoint, runs bench/serve_bench.py (concurrency 1, 16,
# 64 with ShareGPT-like lengths, and the fixed-length comparison with `pagoda bench` at
# concurrency 64), and a short check that the official-client test passes on the GPU build.
# Everything goes to $OUT/serve_h200/ (logs, results.json, table.md).
#
#   here:   scripts/gpu_deps.sh fetch            # .debs/ with cpp-httplib and friends
#   device: bash bench/serve_h200.sh             # run with carry: [".debs"]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
R="$OUT/serve_h200"
mkdir -p "$R"
source scripts/gpu_deps.sh env
nvidia-smi --query-gpu=name,driver_version --format=csv > "$R/gpu.txt" 2>&1
git log -1 --format='%H %s' > "$R/commit.txt" 2>/dev/null || true
B=/tmp/b-serve
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DPAGODA_BUILD_TESTS=OFF -DPAGODA_BUILD_BENCH=OFF > "$R/configure.log" 2>&1 || { tail -30 "$R/configure.log"; exit 1; }
grep -i "cpp-httplib" "$R/configure.log"
cmake --build $B -j"$(nproc)" --target pagoda > "$R/build.log" 2>&1 || { tail -40 "$R/build.log"; exit 1; }
[ -d /tmp/llama-1b ] || python3 tools/make_checkpoint.py --layout 1b --dtype bf16 --seed 0 \
  --out /tmp/llama-1b > "$R/checkpoint.log" 2>&1 || { tail -20 "$R/checkpoint.log"; exit 1; }
# Same engine settings for the server and `pagoda bench`; prompt ids from [1, 256).
python3 bench/serve_bench.py --pagoda $B/pagoda --model /tmp/llama-1b --out "$R" \
  --concurrency 1,16,64 --num-prompts 0 --input-median 256 --output-median 128 \
  --max-input 2048 --max-output 512 --pool-tokens 262144 --max-running 64 \
  --compare-input-len 512 --compare-output-len 256 --compare-requests 512 --compare-repeats 3 \
  2>&1 | tee "$R/serve_bench.log"
# The same comparison with streamed answers (the Python client then reads one event per token).
python3 bench/serve_bench.py --pagoda $B/pagoda --model /tmp/llama-1b --out "$R/streamed" \
  --concurrency 64 --pool-tokens 262144 --max-running 64 --compare-stream \
  --compare-input-len 512 --compare-output-len 256 --compare-requests 512 --compare-repeats 1 \
  2>&1 | tee "$R/serve_bench_streamed.log"
echo "results in $R"
