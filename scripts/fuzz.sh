#!/usr/bin/env bash
# Fuzzes Crucible's parsers with libFuzzer (clang, ASan + UBSan), issue 8.
#
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]
#
# Targets: extxyz, config_yaml, spec_json, manifest, npy, ase_db (default: all six, one
# after the other, 60 s each). Seeds: fuzz/corpus/<target>/ and the kept
# findings fuzz/regressions/<target>/. The growing corpus lives in
# build-fuzz/corpus/<target>/, findings in build-fuzz/findings/<target>/.
# Prints executions, coverage and findings per target; exits non-zero if a
# target found a crash, a leak, a timeout (> 10 s per input) or an input
# that needs more than 1 GiB.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(extxyz config_yaml spec_json manifest npy ase_db)

bash scripts/setup.sh >/dev/null
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCRUCIBLE_BUILD_TESTS=OFF -DCRUCIBLE_BUILD_BENCH=OFF -DCRUCIBLE_BUILD_FUZZ=ON \
  -DCRUCIBLE_SANITIZE=fuzzer-no-link,address,undefined >/dev/null
cmake --build build-fuzz --target "${targets[@]/#/fuzz_}" -- -j"$(nproc)"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
summary=""
for t in "${targets[@]}"; do
  corpus="build-fuzz/corpus/$t"
  findings="build-fuzz/findings/$t"
  mkdir -p "$corpus" "$findings"
  cp -n fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  [ -d fuzz/regressions/"$t" ] && cp -n fuzz/regressions/"$t"/* "$corpus"/ 2>/dev/null || true
  dict=()
  [ -f fuzz/"$t".dict ] && dict=(-dict=fuzz/"$t".dict)
  log="build-fuzz/fuzz_$t.log"
  echo "== fuzz_$t: ${secs} s"
  set +e
  build-fuzz/fuzz/fuzz_"$t" "$corpus" "${dict[@]}" -max_total_time="$secs" -timeout=10 \
    -rss_limit_mb=1024 -malloc_limit_mb=1024 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$findings/" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  peak=$(grep -o 'stat::peak_rss_mb: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(echo "$last" | grep -o 'cov: [0-9]*' | grep -o '[0-9]*' || echo "?")
  ft=$(echo "$last" | grep -o 'ft: [0-9]*' | grep -o '[0-9]*' || echo "?")
  corp=$(echo "$last" | grep -o 'corp: [0-9]*' | grep -o '[0-9]*' || echo "?")
  found=$(find "$findings" -type f | wc -l)
  line=$(printf "%-12s %6s s %11s execs %6s cov %7s ft %6s corpus %6s MB peak RSS %3s findings (exit %s)" \
         "$t" "$secs" "$execs" "$cov" "$ft" "$corp" "$peak" "$found" "$rc")
  echo "$line"
  summary+="$line"$'\n'
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    status=1
    echo "   finding(s) in $findings; log: $log"
    tail -40 "$log"
  fi
done
echo
echo "fuzz summary ($(date -u +%Y-%m-%d), $(nproc) cores):"
printf "%s" "$summary"
exit $status
