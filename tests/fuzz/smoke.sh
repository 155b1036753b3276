#!/bin/sh
# tests/fuzz/smoke.sh — the fuzz smoke of CI: every named harness for SECONDS from the
# checked-in seeds (tests/fuzz/run.sh, one at a time). Any finding fails the run; run.sh has
# printed its reproducer (path and base64) by then, and the summary names the harness.
# usage: tests/fuzz/smoke.sh BUILDDIR SECONDS NAME...
set -u
build=${1:?usage: smoke.sh BUILDDIR SECONDS NAME...}
secs=${2:?usage: smoke.sh BUILDDIR SECONDS NAME...}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
failed=
for name in "$@"; do
    echo "== fuzz smoke: $name, $secs s =="
    sh "$here/run.sh" "$name" "$secs" "$build" || failed="$failed $name"
done
if [ -n "$failed" ]; then
    echo "fuzz smoke: findings in:$failed (reproducers above; check each fixed one in under tests/fuzz/regress/NAME/)" >&2
    exit 1
fi
echo "fuzz smoke: $# harnesses, $secs s each, no finding"
