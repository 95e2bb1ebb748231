#!/usr/bin/env bash
# One GPU session that builds, tests, sanitizes and benchmarks. Run from the repository root on the
# GPU machine; writes logs to $OUT (or ./out), prints a short table last, and packs every log into
# $OUT/0-all-logs.tgz.
#   DEPS_ENV        a script to source first (the machine's toolchain and dependency paths), if any
#   STAGES   which stages to run (unset: "build test bench racecheck memcheck initcheck synccheck"; bench runs before the sanitizers; empty: none)
#   RANDOM_CONFIGS  configurations of the long randomized test (default 2000; RANDOM_TIMEOUT s at most, 300)
#   BENCH_TIMEOUT   seconds the benchmark may take (default 400); ctest runs with --timeout 120
#   BENCH_ARGS      extra arguments of kvrope_bench (default --iters=50)
#   SANITIZE_TIMEOUT seconds per sanitizer process (default 500); JOBS processes run at once (12):
#                   one per (tool, test case) of every GPU binary, see dev/scripts/sanitize_all.sh;
#                   SANITIZE_DEADLINE caps it at that many seconds after this script started
#   EXPERIMENTS     space-separated NAME:FLAGS pairs (FLAGS comma-separated kvrope_bench flags, such as
#                   its tuning flags), each a run of the session's kvrope_bench (fused and in-place,
#                   checked, 30 calls), for example "stages4:--bulk_stages=4 block256:--block=256"
set -uo pipefail
if [[ -n ${DEPS_ENV:-} ]]; then source "$DEPS_ENV"; fi
here=$(dirname "${BASH_SOURCE[0]}")
out=${OUT:-out}
mkdir -p "$out"
stages=${STAGES-"build test bench racecheck memcheck initcheck synccheck"}
build=build-gpu
summary=()
has() { [[ " $stages " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"

if has build; then
  cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKVROPE_BUILD_BENCH=ON \
    > "$out/configure.log" 2>&1 && cmake --build $build -j "$(nproc)" > "$out/build.log" 2>&1
  summary+=("build: rc $?")
fi
if has test; then
  # Time limits throughout: a hung kernel must not spend the session's device time (ctest's own
  # TIMEOUT is 300 s a test; 120 s here fails a hang sooner).
  ctest --test-dir $build --output-on-failure -E consumer --timeout 120 > "$out/ctest.log" 2>&1
  summary+=("ctest: rc $? ($(grep -E 'tests passed' "$out/ctest.log"))")
  KVROPE_RANDOM_CONFIGS=${RANDOM_CONFIGS:-2000} timeout ${RANDOM_TIMEOUT:-300} $build/tests/gpu/gpu_random \
    > "$out/random.log" 2>&1
  summary+=("random x${RANDOM_CONFIGS:-2000}: rc $? ($(tail -n 2 "$out/random.log" | head -n 1))")
fi
if has bench; then
  timeout ${BENCH_TIMEOUT:-400} $build/bench/kvrope_bench ${BENCH_ARGS:---iters=50} --kvrope_json="$out/bench.json" \
    > "$out/bench.log" 2>&1
  summary+=("bench: rc $?")
  grep -E "geomean|mean us|leaderboard statistic" "$out/bench.log"
fi
tools=""
for tool in racecheck memcheck initcheck synccheck; do has $tool && tools+=" $tool"; done
if [[ -n $tools ]]; then
  # One compute-sanitizer process per (tool, test case), JOBS at a time (sanitize_all.sh).
  # SANITIZE_DEADLINE: seconds since this script started by which every sanitizer must have ended.
  timeout_s=${SANITIZE_TIMEOUT:-500}
  if [[ -n ${SANITIZE_DEADLINE:-} ]] && (( SANITIZE_DEADLINE - SECONDS < timeout_s )); then
    timeout_s=$((SANITIZE_DEADLINE - SECONDS))
  fi
  SANITIZE_TIMEOUT=$timeout_s "$here/sanitize_all.sh" $build "$out/sanitize" "$tools" > "$out/sanitize.log" 2>&1
  summary+=("sanitizers ($tools): rc $? ($(tail -n 1 "$out/sanitize.log"))")
fi
for experiment in ${EXPERIMENTS:-}; do
  name=${experiment%%:*}
  flags=${experiment#*:}
  timeout ${BENCH_TIMEOUT:-400} $build/bench/kvrope_bench --variants=fused,inplace --iters=30 ${flags//,/ } \
    ${BENCH_EXP_ARGS:-} --kvrope_json="$out/bench-$name.json" > "$out/bench-$name.log" 2>&1
  summary+=("experiment $name ($flags): rc $?")
  echo "experiment $name"
  grep -E "^(fused|inplace).*geomean" "$out/bench-$name.log"
done
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
# Everything in one archive whose name sorts first, for a device tool that brings back only a few files.
(cd "$out" && tar czf 0-all-logs.tgz --exclude=0-all-logs.tgz . 2>/dev/null)
