#!/usr/bin/env bash
# A/B of two builds of kvrope_bench over every suite, alternated: for each round, each suite runs on
# build A then build B (B then A on odd rounds), under the same protocol (CUPTI clock, L2 flushed,
# median of ITERS calls), unchecked. Prints one line a (round, build, suite, geomean) and keeps the logs.
#   ab_suites.sh BENCH_A BENCH_B OUT   (run from the repository root; ROUNDS=2 ITERS=30 SUITES=...)
set -uo pipefail
a=$1 b=$2 out=$3
mkdir -p "$out"
rounds=${ROUNDS:-2}
iters=${ITERS:-30}
suites=${SUITES:-"leaderboard positions heads head-dims dtypes forward decode styles serve-decode serve-prefill"}
for ((r = 1; r <= rounds; ++r)); do
  order="A B"
  ((r % 2 == 0)) && order="B A"
  for suite in $suites; do
    variants=--variants=fused,inplace
    case $suite in
      forward | decode) variants=--variants=fwd ;;
      styles) variants= ;;
      serve-decode | serve-prefill) variants=--variants=kvrope,kvrope_kip ;;
    esac
    for side in $order; do
      bench=$a
      [[ $side == B ]] && bench=$b
      log="$out/r${r}_${side}_${suite}.log"
      timeout 300 "$bench" --suite="$suite" $variants --iters="$iters" --no_check \
        --kvrope_json=/dev/null > "$log" 2>&1
      grep -E '^[a-z_]+ geomean us = ' "$log" | grep -v event | sed "s/^/round $r $side $suite: /"
    done
  done
done
