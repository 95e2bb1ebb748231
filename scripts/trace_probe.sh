#!/usr/bin/env bash
# Milestone timeline of the fused kernel (kvrope_probe_trace, built with -DKVROPE_TRACE): for each
# SHAPES entry "B:S:S_max:variant", L2 flushed before each of 2 launches, the second reported: when
# the token and copy warps entered, had their bitmask and finished. Run on the GPU machine after
# `source .deps/gpu-env.sh`, after the bench build (BUILD, default build-gpu).
set -uo pipefail
build=${BUILD:-build-gpu}
cmake --build $build --target kvrope_probe_trace > /dev/null 2>&1 || { echo "trace probe build failed"; exit 1; }
for shape in ${SHAPES:-1:691:2048:fused 1:691:2048:inplace 1:1:256:fused 1:1:256:inplace 2:2048:4096:fused}; do
  IFS=: read -r b s l v <<< "$shape"
  timeout 30 $build/bench/kvrope_probe_trace "$b" "$s" "$l" "$v" 2 | sed -n '1p;/launch 1/,$p'
done
