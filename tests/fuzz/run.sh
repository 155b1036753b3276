#!/bin/sh
# tests/fuzz/run.sh — run one libFuzzer harness of the loader for a while (builds nothing).
# usage: tests/fuzz/run.sh NAME SECONDS [BUILDDIR]
#   NAME: st_header | st_index | config; BUILDDIR: a tree configured with
#   CC=clang-14 --enable-fuzzing where `make tests/fuzz/fuzz_NAME` was run (default: .).
# The checked-in seeds (tests/fuzz/corpus/NAME) are only read; new inputs go to a temporary
# corpus that is removed afterwards. Crashes are written to BUILDDIR/fuzz-NAME-crash-*.
set -eu
name=${1:?usage: run.sh NAME SECONDS [BUILDDIR]}
secs=${2:?usage: run.sh NAME SECONDS [BUILDDIR]}
build=${3:-.}
here=$(cd "$(dirname "$0")" && pwd)
bin="$build/tests/fuzz/fuzz_$name"
[ -x "$bin" ] || { echo "run.sh: $bin not built (configure CC=clang-14 --enable-fuzzing; make tests/fuzz/fuzz_$name)" >&2; exit 2; }
[ -d "$here/corpus/$name" ] || { echo "run.sh: no seed corpus $here/corpus/$name" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/epyq-fuzz-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
log="$work/log"
status=0
# UBSan findings must stop the run like ASan ones (FUZZ_CFLAGS keep UBSan recoverable).
UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}
export UBSAN_OPTIONS
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -dict="$here/json.dict" -artifact_prefix="$build/fuzz-$name-crash-" "$work" "$here/corpus/$name" \
    >"$log" 2>&1 || status=$?
tail -n 25 "$log"
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
echo "fuzz_$name: ${execs:-?} executions in ${secs} s, exit status $status"
exit $status
