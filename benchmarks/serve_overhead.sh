#!/bin/sh
# benchmarks/serve_overhead.sh — what HTTP costs: the same N chat requests decoded together
# by `epyq batch --max-batch N` and by `epyq serve --parallel N` as N concurrent SSE streams
# (curl), alternating R times. Tokens/s = completion tokens / seconds from the first request to
# the last token, model load excluded (batch: its own final progress line; serve: wall time of
# the curls). Both include the prompts' prefill. Prints each run and the medians. On a busy
# shared host single runs scatter far more than 3%, so each serve run also reports what it
# spent outside the model, measured inside the process over the generation: CPU seconds of
# every thread but the engine and pool threads (HTTP, JSON, parsing; /proc ticks), and the
# engine thread's busy time outside forward calls (/metrics), both as % of the model's CPU.
#   sh benchmarks/serve_overhead.sh -m DIR [-n 8] [-g 64] [-r 3] [-t 2]
set -u
EPYQ=${EPYQ_BIN:-$PWD/epyq}
M= N=8 G=64 R=3 TH=2
while [ $# -gt 0 ]; do
    case $1 in
    -m) M=$2; shift 2;; -n) N=$2; shift 2;; -g) G=$2; shift 2;; -r) R=$2; shift 2;; -t) TH=$2; shift 2;;
    *) echo "usage: $0 -m DIR [-n N] [-g TOKENS] [-r REPS] [-t THREADS]"; exit 2;;
    esac
done
[ -n "$M" ] || { echo "usage: $0 -m DIR [-n N] [-g TOKENS] [-r REPS] [-t THREADS]"; exit 2; }
T=$(mktemp -d "${TMPDIR:-/tmp}/epyq-ovh.XXXXXX")
SPID=
trap '[ -n "$SPID" ] && kill -KILL "$SPID" 2>/dev/null; rm -rf "$T"' EXIT
body() { printf '{"messages":[{"role":"user","content":"Request %d: tell me a long story about the sea."}],"max_tokens":%d,"temperature":0}' "$1" "$G"; }
i=0
while [ $i -lt "$N" ]; do
    printf '{"custom_id":"r%d","method":"POST","url":"/v1/chat/completions","body":%s}\n' $i "$(body $i)"
    i=$((i + 1))
done >"$T/in.jsonl"
now() { date +%s.%N; }
batch_run() {
    rm -f "$T/out.jsonl"
    "$EPYQ" batch -m "$M" -t "$TH" -c 1024 --max-batch "$N" -i "$T/in.jsonl" -o "$T/out.jsonl" 2>"$T/batch.err" >/dev/null
    tok=$(jq -s 'map(.response.body.usage.completion_tokens) | add' "$T/out.jsonl")
    el=$(tail -n 1 "$T/batch.err" | sed -n 's/.*elapsed \([0-9.]*\)s.*/\1/p')
    # the progress line rounds elapsed to seconds: recompute from its tokens/s, which it does not
    ts=$(tail -n 1 "$T/batch.err" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
    echo "batch: $tok tokens, $ts tokens/s (elapsed ${el}s)"
    echo "$ts" >>"$T/batch.ts"
}
serve_run() {
    rm -f "$T/serve.err" # the last run's "listening" line must not be read for this one
    "$EPYQ" serve -m "$M" -t "$TH" -c 1024 --parallel "$N" --port 0 2>"$T/serve.err" &
    SPID=$!
    while ! grep -q '"event":"listening"' "$T/serve.err" 2>/dev/null; do sleep 0.1; done
    port=$(sed -n 's/.*"event":"listening".*"port":\([0-9]*\).*/\1/p' "$T/serve.err")
    cpu0=$(proc_cpu) mcpu0=$(model_cpu)
    t0=$(now)
    i=0 pids=
    while [ $i -lt "$N" ]; do
        b=$(body $i | sed 's/}$/,"stream":true,"stream_options":{"include_usage":true}}/')
        curl -sN "http://127.0.0.1:$port/v1/chat/completions" -d "$b" >"$T/s$i" &
        pids="$pids $!"
        i=$((i + 1))
    done
    for p in $pids; do wait "$p"; done
    t1=$(now)
    cpu1=$(proc_cpu) mcpu1=$(model_cpu)
    curl -s "http://127.0.0.1:$port/metrics" >"$T/metrics"
    fw=$(sed -n 's/^epyq_forward_seconds_total //p' "$T/metrics")
    busy=$(sed -n 's/^epyq_engine_busy_seconds_total //p' "$T/metrics")
    kill -TERM "$SPID"; wait "$SPID"; SPID=
    tok=0 i=0
    while [ $i -lt "$N" ]; do
        k=$(sed -n 's/^data: //p' "$T/s$i" | grep -v '^\[DONE\]$' | jq -s '[.[].usage.completion_tokens // empty] | add // 0')
        tok=$((tok + k)); i=$((i + 1))
    done
    ts=$(echo "$tok $t0 $t1" | awk '{printf "%.2f", $1 / ($3 - $2)}')
    echo "serve: $tok tokens, $ts tokens/s ($(echo "$t0 $t1" | awk '{printf "%.2f", $2 - $1}')s)"
    echo "$ts" >>"$T/serve.ts"
    echo "$cpu0 $cpu1 $mcpu0 $mcpu1 $fw $busy" | awk '{http = ($2 - $1) - ($4 - $3); model = $4 - $3;
        printf "       outside the model: HTTP threads %.2f CPU s = %.2f%% of the model threads %.2f CPU s; engine thread outside forward (sampling, detokenizing, hand-over; batch does the first two too) %.3f s = %.2f%% of %.2f forward s\n",
               http, (model > 0 ? 100 * http / model : 0), model, $6 - $5, ($5 > 0 ? 100 * ($6 - $5) / $5 : 0), $5}' | tee -a "$T/serve.cpu"
}
# utime + stime in seconds: the whole process (exited threads included), and the engine + pool threads.
proc_cpu() { awk -v hz="$(getconf CLK_TCK)" '{sub(/^.*\) /, ""); print ($12 + $13) / hz}' "/proc/$SPID/stat"; }
model_cpu() {
    for f in /proc/"$SPID"/task/*/stat; do cat "$f" 2>/dev/null; echo; done |
        awk -v hz="$(getconf CLK_TCK)" '/\((epyq_engine|epyq_t[0-9]+)\)/ {sub(/^.*\) /, ""); s += $12 + $13} END {print s / hz}'
}
r=0
while [ $r -lt "$R" ]; do batch_run; serve_run; r=$((r + 1)); done
med() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
b=$(med "$T/batch.ts") s=$(med "$T/serve.ts")
echo "median over $R runs: batch $b tokens/s, serve $s tokens/s, serve/batch = $(echo "$s $b" | awk '{printf "%.3f", $1 / $2}')"
