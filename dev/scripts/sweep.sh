#!/usr/bin/env bash
# Launch-parameter sweep of the fused kernel on the GPU machine (after a bench build in BUILD, default
# build-gpu; DEPS_ENV: a script to source first, if any): for each entry NAME=FLAGS of SWEEP (entries
# separated by ';', FLAGS are kvrope_bench flags separated by ',', such as its tuning flags), runs
# kvrope_bench on CASES (default the small and token-heavy ones) with ARGS (default: fused only, 20
# calls, unchecked) and prints one line of CUPTI medians per entry. Full logs go to $OUT/sweep-NAME.log.
set -uo pipefail
if [[ -n ${DEPS_ENV:-} ]]; then source "$DEPS_ENV"; fi
build=${BUILD:-build-gpu}
out=${OUT:-out}
mkdir -p "$out"
cases=${CASES:-1,3,4,5,7,8,9,12,16}
args=${ARGS:---variants=fused --iters=20 --no_check}
echo "sweep over cases $cases ($args); fused CUPTI medians in us, then the fused geomean of these cases"
IFS=';' read -r -a entries <<< "${SWEEP:-default=}"
for entry in "${entries[@]}"; do
  name=${entry%%=*}
  flags=${entry#*=}
  timeout 120 $build/bench/kvrope_bench --cases="$cases" $args ${flags//,/ } --kvrope_json="$out/sweep-$name.json" \
    > "$out/sweep-$name.log" 2>&1 || echo "$name: rc $?"
  printf '%-16s' "$name"
  grep -E '^backward/fused/case' "$out/sweep-$name.log" | sed -E 's/.*case:([0-9]+).* median_us=([0-9.]+).*/\1:\2/' | tr '\n' ' '
  grep -E '^fused geomean' "$out/sweep-$name.log" | sed 's/fused geomean us = /| geomean /'
  echo
done
# The device tool brings back only a few files of $OUT: the per-entry logs in one archive too.
(cd "$out" && tar czf 0-sweep-logs.tgz sweep-*.log sweep-*.json 2>/dev/null)
