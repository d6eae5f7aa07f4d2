#!/usr/bin/env bash
# Runs a libFuzzer target for a bounded time: FUZZER SEED_CORPUS SECONDS. New inputs go to a
# scratch corpus (the checked-in seeds are only read); a finding is written to the build
# directory as crash-*/leak-*/timeout-* and fails the test.
set -euo pipefail
fuzzer=$1 seeds=$2 seconds=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/cpdrift_fuzz_XXXXXX")
trap 'rm -rf "$work"' EXIT
# Undefined behaviour stops the run like a crash, except what ubsan.supp lists (each justified).
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$(dirname "$0")/ubsan.supp"
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$(dirname "$fuzzer")/$(basename "$fuzzer")-" "$work" "$seeds"
