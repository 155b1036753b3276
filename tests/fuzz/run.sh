#!/bin/sh
# tests/fuzz/run.sh — run one libFuzzer harness for a while (builds nothing).
# usage: tests/fuzz/run.sh NAME SECONDS [BUILDDIR]
#   NAME: st_header | st_index | config | template | outparse | tok_encode | tok_decode |
#   tok_load | batch_req | serve_req | image | session; BUILDDIR: a tree configured with CC=clang-14 --enable-fuzzing where
#   `make fuzz-build` (or `make tests/fuzz/fuzz_NAME`) was run (default: .).
# The checked-in seeds (tests/fuzz/corpus/NAME) are only read; new inputs go to a temporary
# corpus that is removed afterwards. A finding (crash, leak, timeout, out-of-memory) is written
# to BUILDDIR/fuzz-NAME-<kind>-<sha1>; the script then prints its path and its bytes in base64
# (the line to paste into an issue) and exits nonzero. Check a fixed reproducer in under
# tests/fuzz/regress/NAME/ so make check replays it (tests/fuzz/regress_main.c).
set -eu
name=${1:?usage: run.sh NAME SECONDS [BUILDDIR]}
secs=${2:?usage: run.sh NAME SECONDS [BUILDDIR]}
build=${3:-.}
here=$(cd "$(dirname "$0")" && pwd)
bin="$build/tests/fuzz/fuzz_$name"
[ -x "$bin" ] || { echo "run.sh: $bin not built (configure CC=clang-14 --enable-fuzzing; make fuzz-build)" >&2; exit 2; }
[ -d "$here/corpus/$name" ] || { echo "run.sh: no seed corpus $here/corpus/$name" >&2; exit 2; }
# The dictionary that matches the input's language (none for the tokenizer's free text / ids).
case $name in
template) dict="-dict=$here/template.dict" ;;
outparse) dict="-dict=$here/outparse.dict" ;;
tok_encode | tok_decode | image | session) dict= ;;
*) dict="-dict=$here/json.dict" ;;
esac
work=$(mktemp -d "${TMPDIR:-/tmp}/epyq-fuzz-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
log="$work/log"
mkdir "$work/corpus"
: >"$work/before"
ls "$build"/fuzz-"$name"-* >"$work/before" 2>/dev/null || true
status=0
# UBSan findings must stop the run like ASan ones (FUZZ_CFLAGS keep UBSan recoverable).
UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}
export UBSAN_OPTIONS
# shellcheck disable=SC2086 # $dict is one word or none
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    $dict -artifact_prefix="$build/fuzz-$name-" "$work/corpus" "$here/corpus/$name" \
    >"$log" 2>&1 || status=$?
tail -n 25 "$log"
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
echo "fuzz_$name: ${execs:-?} executions in ${secs} s, exit status $status"
for f in "$build"/fuzz-"$name"-*; do
    [ -f "$f" ] || continue
    grep -qxF "$f" "$work/before" && continue
    echo "fuzz_$name: reproducer $f (base64): $(base64 -w0 "$f")"
done
exit $status
