#!/usr/bin/env bash
# One GPU session for a performance round (docs/performance-log.md): builds the bench and the basic
# example only, profiles the example's launch with Nsight Compute (warp stall reasons; NCU= skips it),
# runs the bench (fused and in-place, checked) at the default policy, then SWEEP: space-separated
# sets of kvrope_bench flags, commas between the flags of one set (for example "--block=256
# --bulk_stages=4,--bulk_slack=1"), each run on the cases of SWEEP_CASES (fused, unchecked).
# Run from the repository root on the GPU machine; DEPS_ENV: a script to source first, if any; logs in $OUT.
set -uo pipefail
if [[ -n ${DEPS_ENV:-} ]]; then source "$DEPS_ENV"; fi
out=${OUT:-out}
mkdir -p "$out"
build=build-gpu
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKVROPE_BUILD_BENCH=ON \
  -DKVROPE_BUILD_EXAMPLES=ON > "$out/configure.log" 2>&1 &&
  cmake --build $build -j "$(nproc)" --target kvrope_bench kvrope_example_backward_basic > "$out/build.log" 2>&1 ||
  { echo "build failed"; tail -30 "$out/build.log"; exit 1; }
echo "build done at ${SECONDS}s"
if [[ -n ${NCU-1} ]]; then
  timeout 120 ncu --clock-control none --cache-control all -k regex:backward_kernel -c 1 \
    --section WarpStateStats --section LaunchStats --section SpeedOfLight $build/examples/backward_basic \
    > "$out/ncu.log" 2>&1
  grep -E "Duration|Stall|stall|Warp Cycles|Registers|Shared Memory|Block Size|Grid Size|Issued" "$out/ncu.log" | head -40
fi
$build/bench/kvrope_bench --variants=fused,inplace --iters=${ITERS:-30} ${BENCH_ARGS:-} --kvrope_json="$out/bench.json" \
  > "$out/bench.log" 2>&1
echo "bench rc $? at ${SECONDS}s"
sed -n '/kvrope_bench summary/,$p' "$out/bench.log"
for set in ${SWEEP:-}; do
  flags=${set//,/ }
  name=$(printf '%s' "$set" | tr -c 'A-Za-z0-9' '_')
  $build/bench/kvrope_bench --variants=fused --no_check --iters=20 --cases=${SWEEP_CASES:-1,8,10,12,15} $flags \
    --kvrope_json="$out/sweep-$name.json" > "$out/sweep-$name.log" 2>&1
  echo "sweep $flags (rc $?, ${SECONDS}s):"
  sed -n '/kvrope_bench summary/,/geometric/p' "$out/sweep-$name.log" | grep -E "^ +[0-9]+ " | awk '{print "  case", $1, "fused", $7}'
done
