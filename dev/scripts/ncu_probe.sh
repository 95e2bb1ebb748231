#!/usr/bin/env bash
# Nsight Compute on kvrope_probe (dev/kvrope_probe.cu): duration and warp stall reasons of the fused
# (or decode) kernel for SHAPES ("B:S:S_max:variant[:H:D]" entries, space-separated; H 8 and D 128 by
# default), caches flushed before each profiled launch (--cache-control all), then the same launch with
# warm caches (--cache-control none, the second launch). MEMORY=1 adds the memory counters (DRAM bytes,
# L2 sectors, L1 requests and sectors of global loads and stores): where a head dim's bytes go (perf
# log #39). CACHE_CONTROL: the modes to run (default "all none"). Run from the repository root on the
# GPU machine; DEPS_ENV: a script to source first, if any; BUILD: the build folder (default build-gpu,
# configured here with the dev tools).
set -uo pipefail
if [[ -n ${DEPS_ENV:-} ]]; then source "$DEPS_ENV"; fi
out=${OUT:-out}
mkdir -p "$out"
build=${BUILD:-build-gpu}
cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DKVROPE_BUILD_DEV=ON \
  > "$out/configure.log" 2>&1 && cmake --build $build -j "$(nproc)" --target kvrope_probe > "$out/build-probe.log" 2>&1 ||
  { echo "probe build failed"; tail -30 "$out/build-probe.log"; exit 1; }
metrics="gpu__time_duration.sum,smsp__inst_executed.sum,smsp__average_warp_latency_per_inst_issued.ratio"
metrics+=",regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
memory="dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum"
memory+=",l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
memory+=",l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
if [[ ${MEMORY:-0} == 1 ]]; then metrics+=",$memory"; fi
for shape in ${SHAPES:-1:1:256:inplace 1:1:256:fused 1:691:2048:fused 4:1:512:inplace}; do
  IFS=: read -r b s l v h d <<< "$shape"
  for cc in ${CACHE_CONTROL:-all none}; do
    log="$out/ncu-$b-$s-$l-$v-${h:-8}-${d:-128}-$cc.log"
    timeout 120 ncu --clock-control none --cache-control $cc -k "regex:(backward|decode)_kernel" -s 1 -c 1 --metrics "$metrics" \
      $build/dev/kvrope_probe "$b" "$s" "$l" "$v" 2 "${h:-8}" "${d:-128}" > "$log" 2>&1
    echo "== $shape cache-control $cc"
    grep -E "grid|gpu__time|inst_executed|latency_per|stalled|dram__|lts__|l1tex__" "$log" |
      awk '$NF+0 > 0.3 || /gpu__time|inst_executed|grid|latency_per|dram__|lts__|l1tex__/' |
      sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'
  done
done
