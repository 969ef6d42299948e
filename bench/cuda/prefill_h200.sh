#!/usr/bin/env bash
# One device call for the prefill/extend kernel: GPU tests, our benchmark (plus variant bench
# binaries under $B/var, if any), and the cuDNN / flash SDPA peers of the prefill shape.
# Uses binaries prebuilt in $B (carried: $B/tests_cuda, $B/var, $B/devlibs with libfmt) when they
# run there, else builds them (ninja, sm_90a). Results land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/pagoda_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
B=${B:-build-cpre}
export LD_LIBRARY_PATH="$PWD/$B/devlibs:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
if ! ./$B/tests_cuda/cuda_attention_tests --gtest_list_tests > /dev/null 2>&1; then
  echo "prebuilt binaries do not run here: building"
  B=build-h200p
  cmake -S . -B $B -G Ninja -DPAGODA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DPAGODA_BUILD_TESTS=OFF -DPAGODA_BUILD_BENCH=OFF -DPAGODA_CUDA_DEVICE_TESTS=ON \
    > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  ninja -C $B cuda_attention_tests pagoda_cuda_bench >> "$OUT/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
fi
echo "== tests"
timeout 240 ./$B/tests_cuda/cuda_attention_tests > "$OUT/tests.log" 2>&1; echo "tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED|Failure|Expected|Which|actual" "$OUT/tests.log" | head -40
echo "== bench"
timeout 120 ./$B/tests_cuda/pagoda_cuda_bench "$OUT/ours.jsonl" > /dev/null && grep -E "prefill|extend|tree" "$OUT/ours.jsonl"
for v in ./$B/var/pagoda_cuda_bench_*; do
  [ -x "$v" ] || continue
  n=${v##*_bench_}
  timeout 120 "$v" "$OUT/var_$n.jsonl" > /dev/null && grep -E "prefill|extend|tree" "$OUT/var_$n.jsonl" | sed "s/^/$n /"
done
echo "== peers"
PYTHONUNBUFFERED=1 timeout 180 python3 - "$OUT" <<'PY'
import json, sys, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench
out = sys.argv[1]
torch.manual_seed(0)
res = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
B, S, HQ, HKV, D = 4, 4096, 32, 8, 128
q = torch.randn(B, HQ, S, D, device="cuda", dtype=torch.bfloat16)
k = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
v = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
    def fn():
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    try:
        fn(); torch.cuda.synchronize()
        res[name] = [do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(2)]
    except Exception as e:  # noqa: BLE001
        res[name] = None; print(name, "failed", str(e)[:160])
m = 8192
x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16); y = torch.randn_like(x)
res["gemm_tflops"] = 2 * m**3 / (do_bench(lambda: x @ y, warmup=25, rep=100, return_mode="median") * 1e-3) / 1e12
json.dump(res, open(out + "/peers.json", "w"))
print(json.dumps(res))
PY
