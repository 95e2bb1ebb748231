#!/usr/bin/env bash
# One GPU session for the PyTorch package (python/README.md): builds kvrope_torch for sm_90 against the
# machine's torch (no downloads), runs its pytest suite, bench/torch_compare.py, and kvrope_bench's fused
# and in-place backward for the same cases, whose CUPTI geomean the torch ops' kernel time is compared with.
# Run from the repository root on the GPU machine; logs go to $OUT (or ./out), a short table last.
#   DEPS_ENV       a script to source first (the machine's toolchain and dependency paths), if any
#   STAGES         which stages to run (unset: "build pytest compare bench"; bench builds build-gpu's kvrope_bench)
#   ITERS          calls a case and variant in torch_compare.py and kvrope_bench (default 50)
set -uo pipefail
if [[ -n ${DEPS_ENV:-} ]]; then source "$DEPS_ENV"; fi
out=${OUT:-out}
mkdir -p "$out"
stages=${STAGES-"build pytest compare bench"}
summary=()
has() { [[ " $stages " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
if has bench; then  # in the background: it compiles while the package builds and its tests run
  (cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
     -DKVROPE_BUILD_TESTS=OFF -DKVROPE_BUILD_EXAMPLES=OFF > "$out/bench-configure.log" 2>&1 &&
   cmake --build build-gpu -j 6 --target kvrope_bench > "$out/bench-build.log" 2>&1; echo $? > "$out/bench-build.rc") &
fi
if has build; then
  TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=8 timeout 600 python3 -m pip install --no-build-isolation --no-deps -v ./python \
    > "$out/package-build.log" 2>&1
  summary+=("package build: rc $?")
fi
if has pytest; then
  start=$SECONDS
  timeout 900 python3 -m pytest python/tests -q -rs > "$out/pytest.log" 2>&1
  summary+=("pytest: rc $?, $((SECONDS - start)) s ($(tail -n 1 "$out/pytest.log"))")
fi
if has compare; then
  timeout 900 python3 bench/torch_compare.py --iters "${ITERS:-50}" --json "$out/torch_compare.json" \
    > "$out/torch_compare.log" 2>&1
  summary+=("torch_compare: rc $?")
fi
if has bench; then
  wait
  if [[ $(cat "$out/bench-build.rc" 2>/dev/null) == 0 ]]; then
    timeout 400 build-gpu/bench/kvrope_bench --variants=fused,inplace --iters="${ITERS:-50}" \
      --kvrope_json="$out/bench.json" > "$out/bench.log" 2>&1
    summary+=("kvrope_bench: rc $?")
  else
    summary+=("kvrope_bench: build failed (bench-build.log)")
  fi
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv,noheader | tee -a "$out/gpu.txt"
echo
printf '%s\n' "${summary[@]}"
[[ -f "$out/torch_compare.log" ]] && sed -n '/geometric means/,$p' "$out/torch_compare.log"
[[ -f "$out/bench.log" ]] && grep -E "^(fused|inplace) geomean us" "$out/bench.log"
if [[ -f "$out/torch_compare.json" && -f "$out/bench.json" ]]; then  # the op's kernel time against the bench's
  python3 - "$out/torch_compare.json" "$out/bench.json" <<'PY'
import json, math, sys
t, b = (json.load(open(p)) for p in sys.argv[1:3])
fused = {c["case"]: c["variants"]["fused"]["median_us"] for c in b["cases"]}
r = [c["bwd_kvrope"][1] / fused[c["case"]] for c in t["cases"] if c["case"] in fused]
print(f"bwd_kvrope CUPTI / kvrope_bench fused: geomean {math.exp(sum(map(math.log, r)) / len(r)):.3f}, "
      f"per case {min(r):.3f}-{max(r):.3f}")
PY
fi
(cd "$out" && tar czf 0-all-logs.tgz --exclude=0-all-logs.tgz . 2>/dev/null)
