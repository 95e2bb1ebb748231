#!/usr/bin/env bash
# A short GPU call (from the repository root on the GPU machine; carry .deps): builds the GPU tests for sm_90
# and runs every test case of every GPU test binary under compute-sanitizer memcheck, JOBS at a time, until
# DEADLINE seconds (default 300) from the start. The random tests draw KVROPE_RANDOM_CONFIGS configurations
# (default here 20: memcheck checks the code paths, the long runs count configurations). The per-process lines
# and the error summaries go to $OUT/memcheck.txt.
set -uo pipefail
source .deps/gpu-env.sh
out=${OUT:-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee "$out/memcheck.txt"
tests=(append append_random forward backward launch random nvfp4 mla_append)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 > /tmp/configure.log 2>&1 &&
  cmake --build build-gpu -j 16 --target "${tests[@]/#/kvrope_gpu_}" > /tmp/build.log 2>&1
echo "build: rc $? ($SECONDS s)" | tee -a "$out/memcheck.txt"
tail -n 20 /tmp/build.log > "$out/build_tail.txt"
left=$((${DEADLINE:-300} - SECONDS))
KVROPE_RANDOM_CONFIGS=${KVROPE_RANDOM_CONFIGS:-20} SANITIZE_TIMEOUT=$((left - 15)) JOBS=${JOBS:-16} timeout $((left - 5)) \
  dev/scripts/sanitize_all.sh build-gpu /tmp/san memcheck >> "$out/memcheck.txt" 2>&1
echo "memcheck: rc $? ($SECONDS s)" | tee -a "$out/memcheck.txt"
grep -hE 'ERROR SUMMARY' /tmp/san/*.log 2>/dev/null | sort | uniq -c | tee -a "$out/memcheck.txt"
grep -c ': rc 0,' "$out/memcheck.txt"
grep -v ': rc 0,' "$out/memcheck.txt" | tail -n 30
