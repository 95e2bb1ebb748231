#!/usr/bin/env bash
# Nsight Compute on the serving forward's kernels (append_token_kernel, append_tile_kernel) inside
# kvrope_bench: duration, warp stall reasons, instructions, occupancy and memory counters of one launch a
# case, L2 flushed before it
# (--cache-control all). CASES: "suite:case" entries (default: decode T = 1 bf16 and fp8, prefill 1 x
# 8,192 bf16 and fp8 at Hq = 32). Run from the repository root on the GPU machine after a build into
# $BUILD (build-gpu); logs under $OUT.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
build=${BUILD:-build-gpu}
metrics="gpu__time_duration.sum,smsp__inst_executed.sum,smsp__average_warp_latency_per_inst_issued.ratio"
metrics+=",regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
metrics+=",launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers"
metrics+=",sm__warps_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed"
metrics+=",dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum"
metrics+=",lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
for entry in ${CASES:-serve-decode:1 serve-decode:3 serve-prefill:25 serve-prefill:27}; do
  IFS=: read -r suite id <<< "$entry"
  log="$out/ncu-$suite-$id.log"
  timeout 120 ncu --clock-control none --cache-control all -k "regex:${KERNEL:-append_(token|tile)_kernel}" -s ${SKIP:-2} -c 1 \
    --metrics "$metrics" $build/bench/kvrope_bench --suite=$suite --cases=$id --variants=${VARIANT:-kvrope} --iters=5 --clock=events \
    > "$log" 2>&1
  echo "== $suite case $id"
  grep -E "append_(token|tile)_kernel|gpu__time|inst_executed|latency_per|stalled|dram__|lts__|launch__|sm__|issue_active" "$log" |
    awk '!/stalled/ || $NF+0 > 0.1' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | cut -c1-160
done
