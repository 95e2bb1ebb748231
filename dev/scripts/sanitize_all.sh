#!/usr/bin/env bash
# Runs compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over every test case of every
# GPU test binary, one process per (tool, test case), JOBS at a time, each under a timeout.
# Usage: dev/scripts/sanitize_all.sh BUILD_DIR OUT_DIR [TOOLS]
#   JOBS (default 12), SANITIZE_TIMEOUT seconds per process (default 500),
#   BINARIES the test binaries' glob under BUILD_DIR/tests/gpu (default gpu_*)
# Prints one line per process ("tool binary [test case]: rc N, summary") and a last line with the
# count of failures; exits non-zero when any process failed or timed out.
set -uo pipefail
build=$1
out=$2
tools=${3:-"racecheck memcheck initcheck synccheck"}
mkdir -p "$out"
jobs_file=$out/sanitize-jobs.txt
: > "$jobs_file"
# racecheck first: it is the slowest.
for tool in $tools; do
  for bin in "$build"/tests/gpu/${BINARIES:-gpu_*}; do
    # Catch2 v2 lists the names with --list-test-names-only, v3 with --list-tests --verbosity quiet.
    list=(--list-test-names-only)
    "$bin" "${list[@]}" 2>&1 | grep -q 'Unrecognised token' && list=(--list-tests --verbosity quiet)
    "$bin" "${list[@]}" 2>/dev/null | sed -E -e '/^ *$/d' -e 's/^ *//' -e '/^[0-9]+ (matching )?test cases?$/d' | while IFS= read -r name; do
      printf '%s\t%s\t%s\n' "$tool" "$bin" "$name" >> "$jobs_file"
    done
  done
done

if [[ ! -s $jobs_file ]]; then
  echo "sanitize: no test cases listed under $build/tests/gpu" >&2
  exit 1
fi

run_one() {
  local tool=$1 bin=$2 name=$3 out=$4
  local log
  # (the name cut to 60 characters, then a checksum of the whole: a template test's instances differ
  # only at its end, and shared one log before)
  log="$out/$tool-$(basename "$bin")-$(printf '%s' "$name" | tr -c 'A-Za-z0-9' '_' | cut -c1-60)-$(printf '%s' "$name" | cksum | cut -d' ' -f1).log"
  # Catch2 test specs separate alternatives with commas: escape those in the name.
  timeout "${SANITIZE_TIMEOUT:-500}" compute-sanitizer --tool "$tool" --error-exitcode 1 "$bin" "${name//,/\\,}" \
    > "$log" 2>&1
  local rc=$?
  local summary
  summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)
  local cases
  cases=$(grep -E '^(All tests passed|test cases:)' "$log" | tail -n 1)
  printf '%s %s [%s]: rc %d, %s, %s\n' "$tool" "$(basename "$bin")" "$name" "$rc" "${summary:-no summary}" "${cases:-?}"
}
export -f run_one
export SANITIZE_TIMEOUT
tr '\n' '\0' < "$jobs_file" | xargs -0 -P "${JOBS:-12}" -I{} bash -c \
  'IFS=$'"'"'\t'"'"' read -r tool bin name <<< "$1"; run_one "$tool" "$bin" "$name" "$2"' _ {} "$out" \
  | tee "$out/sanitize-summary.txt"
failures=$(grep -vc ': rc 0,' "$out/sanitize-summary.txt")
echo "sanitize: $(wc -l < "$out/sanitize-summary.txt") processes, $failures failed"
[[ $failures == 0 ]]
