#!/usr/bin/env bash
# The closing GPU call of a change, from the repository root on the GPU machine, within one 600 s call: builds
# this tree (the GPU tests, the examples, the bench), the bench of each base tree in BASE (BASE/src, carried:
# `git archive` of the commit compared against; several, space-separated) and, in the background, the PyTorch
# package and FlashInfer's JIT modules; runs the examples, the GPU tests named in TESTS (default all,
# TEST_TIMEOUT s each; append_random: RANDOM_CONFIGS; mla_append: MLA_RANDOM_CONFIGS, its random test then in
# MLA_RANDOM_SHARDS processes, default 8), the A/B of the base and this tree on AB_SUITES (unchecked; default
# six, empty none), this tree's CHECKED_SUITES checked (default the serve suites, with the host time; empty
# none; the comparison runs them whatever it says), the serve suites' floor study (FLOOR=0 skips it),
# FlashInfer's comparison (bench/flashinfer_compare.py, dev/scripts/serve_vs_flashinfer.py; COMPARE=0 skips it,
# COMPARE=setup only sets FlashInfer up for pytest), compute-sanitizer's SANITIZE_TOOLS (default all four) over
# SANITIZE_BINARIES (default gpu_append*; random tests at SANITIZE_RANDOM_CONFIGS, default 20; SANITIZE=0 skips
# them) and pytest over PYTEST_TESTS (default python/tests; PYTEST=0 skips it and the package build).
# AB_DECODE_CASES / AB_PREFILL_CASES limit the A/B's serve cases (default: all); DECODE_VARIANTS the checked
# decode run's. Logs in $OUT/logs.tar.gz (the device returns few files), the summary in $OUT/summary.txt. Carry
# .deps, peers and BASE. On an H100 every test binary, the A/B of the serve suites and the checked suites end
# near 520 s, and the comparison (about 130 s) is skipped: name fewer TESTS, or compare in a call of its own.
#   BASE=build-base dev/scripts/closing_call.sh
set -uo pipefail
source .deps/gpu-env.sh
out=${OUT:-out}
logs=$out/logs
rm -rf "$logs" && mkdir -p "$logs"  # (a machine once returned an earlier call's logs here)
bases=(${BASE:-build-base})  # (several, space-separated: each is built and timed beside this tree)
iters=${ITERS:-50}
summary=()
left() { echo $((${DEADLINE:-560} - SECONDS)); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee "$logs/gpu.txt"
[[ ${COMPARE:-1} != 0 ]] && source dev/scripts/flashinfer_setup.sh > "$logs/fi_setup.log" 2>&1
cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)
base_pids=()
for base in "${bases[@]}"; do
  b=$(basename "$base")
  (cmake -S "$base/src" -B "$base/b" "${cfg[@]}" > "$logs/${b}_configure.log" 2>&1 &&
    cmake --build "$base/b" --target kvrope_bench -j 3 > "$logs/${b}_build.log" 2>&1
  echo $? > /tmp/$b.rc) &
  base_pids+=($!)
done
if [[ ${PYTEST:-1} == 1 ]]; then
  (TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=3 timeout 400 python3 -m pip install --no-build-isolation --no-deps ./python \
    > "$logs/package.log" 2>&1; echo $? > /tmp/package.rc) &
else
  echo skipped > /tmp/package.rc
fi
if [[ ${COMPARE:-1} != 0 ]]; then
  (timeout 300 python3 -u bench/flashinfer_compare.py --build-only > "$logs/fi_build.log" 2>&1; echo $? > /tmp/fi.rc) &
else
  (echo skipped > /tmp/fi.rc) &
fi
fi_pid=$!
floor_target=()
[[ ${FLOOR:-1} == 1 ]] && floor_target=(append_floor_study)
cmake -S . -B build-gpu "${cfg[@]}" -DKVROPE_BUILD_DEV=${FLOOR:-1} > "$logs/configure.log" 2>&1 &&
  cmake --build build-gpu -j 9 --target "${floor_target[@]}" kvrope_bench kvrope_gpu_append kvrope_gpu_append_random kvrope_gpu_forward \
    kvrope_gpu_backward kvrope_gpu_launch kvrope_gpu_random kvrope_gpu_nvfp4 kvrope_gpu_mla_append kvrope_example_backward_basic \
    kvrope_example_training_step kvrope_example_custom_kernel > "$logs/build.log" 2>&1
summary+=("build: rc $? ($SECONDS s)")
for e in backward_basic training_step custom_kernel; do
  timeout 60 build-gpu/examples/$e > "$logs/example_$e.log" 2>&1
  summary+=("example $e: rc $? ($(tail -n 1 "$logs/example_$e.log")) ($SECONDS s)")
done
tests_line() { grep -E 'passed|failed' "$1" | tail -n 1; }  # (a Catch2 log's verdict)
for t in ${TESTS-append forward backward launch random nvfp4 mla_append append_random}; do
  [[ $t == append_random ]] && continue
  filter=()  # (gpu_mla_append with MLA_RANDOM_CONFIGS: its random test in shards, below)
  [[ $t == mla_append && -n ${MLA_RANDOM_CONFIGS:-} ]] && filter=("~[random]")
  timeout ${TEST_TIMEOUT:-150} build-gpu/tests/gpu/gpu_$t "${filter[@]}" > "$logs/gpu_$t.log" 2>&1
  summary+=("gpu_$t${filter[*]:+ ${filter[*]}}: rc $? ($(tests_line "$logs/gpu_$t.log")) ($SECONDS s)")
done
if [[ " ${TESTS-mla_append} " == *" mla_append "* && -n ${MLA_RANDOM_CONFIGS:-} ]]; then
  # MLA_RANDOM_CONFIGS random configurations (0.15-0.3 s each) in MLA_RANDOM_SHARDS processes at once, seeds 1,
  # 2, ...: one process would take most of a call.
  shards=${MLA_RANDOM_SHARDS:-8}
  per_shard=$(((MLA_RANDOM_CONFIGS + shards - 1) / shards))
  shard_pids=()
  for ((seed = 1; seed <= shards; ++seed)); do
    KVROPE_RANDOM_CONFIGS=$per_shard KVROPE_RANDOM_SEED=$seed timeout ${TEST_TIMEOUT:-150} \
      build-gpu/tests/gpu/gpu_mla_append "[random]" > "$logs/mla_random_$seed.log" 2>&1 &
    shard_pids+=($!)
  done
  for ((seed = 1; seed <= shards; ++seed)); do
    wait ${shard_pids[$((seed - 1))]}
    summary+=("gpu_mla_append [random] seed $seed x$per_shard: rc $? ($(tests_line "$logs/mla_random_$seed.log")) ($SECONDS s)")
  done
fi
if [[ " ${TESTS-append_random} " == *" append_random "* ]]; then
  KVROPE_RANDOM_CONFIGS=${RANDOM_CONFIGS:-2000} timeout 150 build-gpu/tests/gpu/gpu_append_random > "$logs/append_random.log" 2>&1
  summary+=("append_random x${RANDOM_CONFIGS:-2000}: rc $? ($(tests_line "$logs/append_random.log")) ($SECONDS s)")
fi
wait "${base_pids[@]}" $fi_pid  # (the package may still be building: pytest comes last)
for base in "${bases[@]}"; do summary+=("$(basename "$base") build: rc $(cat /tmp/$(basename "$base").rc)"); done
summary+=("flashinfer JIT: rc $(cat /tmp/fi.rc) ($SECONDS s)")
# A/B, unchecked, base then this tree: serve suites on the base's cases, the backward, the forward.
for s in ${AB_SUITES-serve-decode serve-prefill leaderboard forward decode styles}; do
  args=(--iters=$iters --no_check)
  case $s in
    serve-decode) args+=(--variants=kvrope,kvrope_kip ${AB_DECODE_CASES:+--cases=$AB_DECODE_CASES}) ;;
    serve-prefill) args+=(--variants=kvrope,kvrope_kip ${AB_PREFILL_CASES:+--cases=$AB_PREFILL_CASES}) ;;
    leaderboard) args+=(--variants=fused,inplace) ;;
    *) ;;
  esac
  for side in "${bases[@]}" new; do
    bench=build-gpu/bench/kvrope_bench
    [[ $side != new ]] && bench=$side/b/bench/kvrope_bench && side=$(basename "$side")
    timeout 100 "$bench" --suite=$s "${args[@]}" --kvrope_json="$logs/ab_${side}_$s.json" > "$logs/ab_${side}_$s.log" 2>&1
    summary+=("ab $side $s: rc $? ($SECONDS s)")
  done
done
checked=(${CHECKED_SUITES-serve-decode serve-prefill})
# (the comparison reads this tree's checked serve suites: they run whenever it does)
if [[ ${COMPARE:-1} == 1 ]]; then
  for s in serve-decode serve-prefill; do [[ " ${checked[*]} " == *" $s "* ]] || checked+=($s); done
fi
for s in "${checked[@]}"; do
  extra=()  # (decode: the PDL pair too, when this tree's bench has it: DECODE_VARIANTS)
  [[ $s == serve-decode && -n ${DECODE_VARIANTS:-} ]] && extra=(--variants=$DECODE_VARIANTS)
  timeout 150 build-gpu/bench/kvrope_bench --suite=$s "${extra[@]}" --iters=$iters --kvrope_json="$logs/$s.json" \
    > "$logs/$s.log" 2>&1
  summary+=("$s checked: rc $? ($SECONDS s)")
done
# The serve suites' memory work alone (dev/append_floor_study.cu, about 40 s): what the targets ask against it.
if [[ ${FLOOR:-1} == 1 ]] && (($(left) > 90)); then
  timeout 100 build-gpu/dev/append_floor_study --iters=$iters > "$logs/append_floor.log" 2>&1
  summary+=("append_floor_study: rc $? ($SECONDS s)")
fi
# (the comparison takes about 130 s on an H100 or H200, and cut short it prints no case: it gets up to 200 s of
# what is left, the sanitizers and pytest the rest)
if [[ ${COMPARE:-1} == 1 ]] && (($(left) > 150)); then
  compare_s=$(($(left) - 10)); ((compare_s > 200)) && compare_s=200
  timeout $compare_s python3 -u bench/flashinfer_compare.py --iters $iters --json "$logs/flashinfer_compare.json" \
    > "$logs/flashinfer_compare.log" 2>&1
  summary+=("compare: rc $? ($SECONDS s)")
  python3 dev/scripts/serve_vs_flashinfer.py "$logs/flashinfer_compare.log" "$logs/serve-decode.log" \
    "$logs/serve-prefill.log" > "$logs/serve_vs_flashinfer.txt" 2>&1
fi
if [[ ${SANITIZE:-1} == 1 ]] && (($(left) > 60)); then
  # (the random tests at SANITIZE_RANDOM_CONFIGS configurations under a tool: their default 300, each slower
  # under a sanitizer, would take the call)
  KVROPE_RANDOM_CONFIGS=${SANITIZE_RANDOM_CONFIGS:-20} SANITIZE_TIMEOUT=$(($(left) - 40)) JOBS=12 \
    BINARIES=${SANITIZE_BINARIES:-'gpu_append*'} timeout $(($(left) - 30)) \
    dev/scripts/sanitize_all.sh build-gpu /tmp/san "${SANITIZE_TOOLS:-racecheck memcheck initcheck synccheck}" \
    > "$logs/sanitize.txt" 2>&1
  summary+=("sanitize (${SANITIZE_TOOLS:-4 tools} over ${SANITIZE_BINARIES:-gpu_append*}): rc $? ($(tail -n 1 "$logs/sanitize.txt")) ($SECONDS s)")
  grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san/*.log 2>/dev/null | sort | uniq -c > "$logs/sanitize_summaries.txt"
fi
wait
summary+=("package build: rc $(cat /tmp/package.rc) ($SECONDS s)")
if [[ ${PYTEST:-1} == 1 ]] && (($(left) > 30)); then
  timeout $(($(left) - 10)) python3 -m pytest ${PYTEST_TESTS:-python/tests} -q -rs -x > "$logs/pytest.log" 2>&1
  summary+=("pytest: rc $? ($(tail -n 1 "$logs/pytest.log")) ($SECONDS s)")
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee -a "$logs/gpu.txt"
{
  cat "$logs/gpu.txt"
  for f in "$logs"/ab_*.log "$logs"/serve-*.log; do
    [[ -f $f ]] && grep -HE "^[a-z_]+ geomean us|/floor geomean|floor\+empty\) geomean|CHECK FAILED|SM clock|serve-host|check:|^pdl:" "$f" |
      grep -v event | sed "s|$logs/||"
  done
  grep -E 'geomean|max' "$logs/serve_vs_flashinfer.txt" 2>/dev/null
  grep -E 'geomean' "$logs/append_floor.log" 2>/dev/null
  cat "$logs/sanitize_summaries.txt"
  printf '%s\n' "${summary[@]}"
} > "$out/summary.txt"
tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
cat "$out/summary.txt"
