#!/bin/sh
# benchmarks/serve_load.sh — the bounded load test of `epyq serve` (not part of make check):
# a tiny synthetic checkpoint, the server on a free port, benchmarks/serve_load.mjs with
# 200 requests at concurrency 32 by default (extra arguments go to it), then SIGTERM and the
# server's exit status. Run from the build tree:  sh benchmarks/serve_load.sh [-n 200 -c 32]
#   EPYQ_SERVE_ARGS  extra server flags (default "-t 2 --parallel 16 --max-queue 64")
set -u
EPYQ=${EPYQ_BIN:-$PWD/epyq}
SRC=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/epyq-load.XXXXXX")
SPID=
trap '[ -n "$SPID" ] && kill -KILL "$SPID" 2>/dev/null; rm -rf "$T"' EXIT
"$EPYQ" synth -o "$T/tiny" --shape tiny --format ct -t 1 >/dev/null 2>&1 || { echo "synth failed"; exit 1; }
# shellcheck disable=SC2086
"$EPYQ" serve -m "$T/tiny" --port 0 -c 1024 ${EPYQ_SERVE_ARGS:--t 2 --parallel 16 --max-queue 64} 2>"$T/err" &
SPID=$!
i=0
while ! grep -q '"event":"listening"' "$T/err"; do
    i=$((i + 1)); [ $i -gt 600 ] && { cat "$T/err"; exit 1; }; sleep 0.05
done
port=$(sed -n 's/.*"event":"listening".*"port":\([0-9]*\).*/\1/p' "$T/err")
node "$SRC/benchmarks/serve_load.mjs" --url "http://127.0.0.1:$port" --pid "$SPID" "$@"
rc=$?
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^epyq_(requests_total|requests_cancelled|generation_tokens|decode_tokens_per|kv_bytes)'
kill -TERM "$SPID"; wait "$SPID"; src=$?; SPID=
echo "server exit status after SIGTERM: $src"
[ $rc = 0 ] && [ $src = 0 ]
