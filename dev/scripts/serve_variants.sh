#!/usr/bin/env bash
# Builds kvrope_bench once a variant and runs the serve suites on it, on the GPU machine from the
# repository root (after `source .deps/gpu-env.sh`). VARIANTS: "name=-DMACRO=VALUE,-DOTHER" entries
# separated by ';' (compile-time switches a study adds, e.g. -DKVROPE_DEV_* macros), each built into
# build-var-NAME; SUITES (serve-decode serve-prefill); ITERS (50). Logs under $OUT/var-NAME-SUITE.log;
# prints each run's geomean lines.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
IFS=';' read -r -a entries <<< "${VARIANTS:?}"
for entry in "${entries[@]}"; do
  name=${entry%%=*}
  flags=${entry#*=}
  build=build-var-$name
  cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKVROPE_BUILD_TESTS=OFF \
    -DKVROPE_BUILD_EXAMPLES=OFF "-DCMAKE_CUDA_FLAGS=${flags//,/ }" > "$out/var-$name-configure.log" 2>&1 &&
    cmake --build $build -j "$(nproc)" --target kvrope_bench > "$out/var-$name-build.log" 2>&1 ||
    { echo "$name: build failed"; tail -20 "$out/var-$name-build.log"; continue; }
  for s in ${SUITES:-serve-decode serve-prefill}; do
    timeout 200 $build/bench/kvrope_bench --suite=$s --iters=${ITERS:-50} > "$out/var-$name-$s.log" 2>&1
    echo "== $name $s: rc $?"
    grep -hE "^kvrope (geomean|/)|^kvrope/|CHECK FAILED" "$out/var-$name-$s.log" | head -12
  done
done
