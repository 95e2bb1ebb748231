#!/usr/bin/env bash
# One GPU call of the serving forward's work (docs/benchmarks.md, "Serve suites"), by stages, from the
# repository root on the GPU machine, logs under $OUT and a summary last. Carry .deps and peers.
#   STAGES  "build test bench" (default) or any of: build test bench sanitize pytest compare
#   build:    the C++ tree (tests, bench) into build-gpu; in the background, the PyTorch package and
#             FlashInfer's JIT modules (both CPU work, done by the time the later stages need them)
#   test:     ctest (no consumers), the random tests at RANDOM_CONFIGS (2000)
#   bench:    kvrope_bench's serve suites, checked, ITERS (50) calls a case
#   sanitize: the four compute-sanitizer tools over every GPU test case (dev/scripts/sanitize_all.sh)
#   pytest:   python/tests;  compare: bench/flashinfer_compare.py
set -uo pipefail
source .deps/gpu-env.sh
out=${OUT:-out}
mkdir -p "$out"
stages=${STAGES-"build test bench"}
has() { [[ " $stages " == *" $1 "* ]]; }
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
source dev/scripts/flashinfer_setup.sh > "$out/fi_setup.log" 2>&1
if has build; then
  (TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=4 timeout 560 python3 -m pip install --no-build-isolation --no-deps ./python \
     > "$out/package.log" 2>&1; echo $? > /tmp/package.rc) &
  (timeout 300 python3 -u bench/flashinfer_compare.py --build-only > "$out/fi_build.log" 2>&1; echo $? > /tmp/fi_build.rc) &
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/configure.log" 2>&1 &&
    cmake --build build-gpu -j 10 > "$out/build.log" 2>&1
  summary+=("build: rc $? ($SECONDS s)")
fi
if has test; then
  ctest --test-dir build-gpu --output-on-failure -E consumer --timeout 200 -j 4 > "$out/ctest.log" 2>&1
  summary+=("ctest: rc $? ($(grep -E 'tests passed' "$out/ctest.log")) ($SECONDS s)")
  for t in ${RANDOM_TESTS:-append_random}; do
    KVROPE_RANDOM_CONFIGS=${RANDOM_CONFIGS:-2000} timeout 150 build-gpu/tests/gpu/gpu_$t > "$out/$t.log" 2>&1
    summary+=("$t x${RANDOM_CONFIGS:-2000}: rc $? ($(tail -n 2 "$out/$t.log" | head -n 1)) ($SECONDS s)")
  done
fi
if has bench; then
  for s in serve-decode serve-prefill; do
    timeout 150 build-gpu/bench/kvrope_bench --suite=$s --iters=${ITERS:-50} --kvrope_json="$out/$s.json" \
      > "$out/$s.log" 2>&1
    summary+=("$s: rc $? ($SECONDS s)")
  done
fi
if has sanitize; then
  SANITIZE_TIMEOUT=${SANITIZE_TIMEOUT:-300} JOBS=14 dev/scripts/sanitize_all.sh build-gpu /tmp/san > "$out/sanitize.txt" 2>&1
  summary+=("sanitize: rc $? ($(tail -n 1 "$out/sanitize.txt")) ($SECONDS s)")
  grep -v ': rc 0' "$out/sanitize.txt" | head -n 20 > "$out/sanitize_failures.txt"
fi
wait
[[ -f /tmp/package.rc ]] && summary+=("package build: rc $(cat /tmp/package.rc)")
[[ -f /tmp/fi_build.rc ]] && summary+=("flashinfer JIT: rc $(cat /tmp/fi_build.rc)")
if has pytest; then
  timeout 300 python3 -m pytest python/tests -q -rs > "$out/pytest.log" 2>&1
  summary+=("pytest: rc $? ($(tail -n 1 "$out/pytest.log")) ($SECONDS s)")
fi
if has compare; then
  timeout 240 python3 -u bench/flashinfer_compare.py --iters ${ITERS:-50} --json "$out/flashinfer_compare.json" \
    > "$out/flashinfer_compare.log" 2>&1
  summary+=("compare: rc $? ($SECONDS s)")
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee -a "$out/gpu.txt"
grep -hE "geomean|CHECK FAILED|SM clock" "$out"/serve-*.log 2>/dev/null
printf '%s\n' "${summary[@]}"
