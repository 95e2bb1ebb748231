#!/usr/bin/env bash
# One GPU call of the append's work, from the repository root on the GPU machine: builds this tree (the
# append tests and the bench) and, beside it, the bench of a base tree (BASE/src, e.g. `git archive` of the
# commit compared against, carried); runs the append tests, the random test (RANDOM_CONFIGS), then the serve
# suites of both benches on the base's cases (ITERS calls a case, unchecked) and this tree's suites checked. Logs under $OUT, a summary last. Carry .deps and BASE.
#   BASE=build-base SUITES="serve-decode serve-prefill" dev/scripts/append_ab.sh
set -uo pipefail
source .deps/gpu-env.sh
out=${OUT:-out}
mkdir -p "$out"
base=${BASE:-build-base}
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)
if [[ -d $base/src ]]; then
  (cmake -S "$base/src" -B "$base/b" "${cfg[@]}" > "$out/base_configure.log" 2>&1 &&
    cmake --build "$base/b" --target kvrope_bench -j 6 > "$out/base_build.log" 2>&1
  echo $? > /tmp/base.rc) &
fi
cmake -S . -B build-gpu "${cfg[@]}" ${EXTRA_CMAKE:-} > "$out/configure.log" 2>&1 &&
  cmake --build build-gpu -j 10 --target ${TARGETS:-kvrope_bench gpu_append gpu_append_random host_append_plan} \
    > "$out/build.log" 2>&1
summary+=("build: rc $? ($SECONDS s)")
wait
[[ -f /tmp/base.rc ]] && summary+=("base build: rc $(cat /tmp/base.rc) ($SECONDS s)")
for t in ${TESTS:-append}; do
  timeout 300 build-gpu/tests/gpu/gpu_$t > "$out/gpu_$t.log" 2>&1
  summary+=("gpu_$t: rc $? ($(tail -n 2 "$out/gpu_$t.log" | head -n 1)) ($SECONDS s)")
done
if [[ ${RANDOM_CONFIGS:-2000} -gt 0 ]]; then
  KVROPE_RANDOM_CONFIGS=${RANDOM_CONFIGS:-2000} timeout 300 build-gpu/tests/gpu/gpu_append_random > "$out/append_random.log" 2>&1
  summary+=("append_random x${RANDOM_CONFIGS:-2000}: rc $? ($(tail -n 2 "$out/append_random.log" | head -n 1)) ($SECONDS s)")
fi
# A/B on the base's cases (decode 1-48, prefill 1-32), base then this tree, unchecked, k read only and in place.
if [[ -x $base/b/bench/kvrope_bench ]]; then
  for s in ${SUITES:-serve-decode serve-prefill}; do
    n=48
    [[ $s == serve-prefill ]] && n=32
    for side in base new; do
      bench=build-gpu/bench/kvrope_bench
      [[ $side == base ]] && bench=$base/b/bench/kvrope_bench
      timeout 200 "$bench" --suite=$s --variants=kvrope,kvrope_kip --iters=${ITERS:-50} --no_check \
        --cases=$(seq -s, 1 $n) --kvrope_json="$out/ab_${side}_$s.json" > "$out/ab_${side}_$s.log" 2>&1
      summary+=("ab $side $s: rc $? ($SECONDS s)")
    done
  done
fi
for s in ${CHECKED:-serve-decode serve-prefill}; do
  timeout 200 build-gpu/bench/kvrope_bench --suite=$s --iters=${ITERS:-50} --kvrope_json="$out/$s.json" > "$out/$s.log" 2>&1
  summary+=("$s checked: rc $? ($SECONDS s)")
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee -a "$out/gpu.txt"
for f in "$out"/ab_*.log "$out"/serve-*.log; do
  [[ -f $f ]] && grep -HE "geomean|CHECK FAILED|SM clock|serve-host|check:" "$f" | grep -v event | sed "s|$out/||"
done
printf '%s\n' "${summary[@]}"
