#!/bin/sh
# `epyq chat` on a real terminal, driven through tmux (send-keys / capture-pane): banner and
# prompt, streamed answers, /regen, /clear, Ctrl-C mid-answer (answer stops, REPL stays), a
# second Ctrl-C while idle (exit 130), /exit (exit 0), history file written. Skips without tmux.
command -v tmux >/dev/null 2>&1 || { echo "tmux missing: skipped"; exit 77; }
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
make_model
SOCK="$T/tmux.sock"
tm() { tmux -S "$SOCK" "$@"; }
trap 'tm kill-server 2>/dev/null; rm -rf "$T"' EXIT
screen() { tm capture-pane -p -J -S -200 -t "$1"; }
# wait_for SESSION REGEX [tenths]: poll the pane until REGEX shows up.
wait_for() {
    i=0
    while [ $i -lt "${3:-300}" ]; do
        screen "$1" | grep -q -- "$2" && return 0
        sleep 0.1; i=$((i + 1))
    done
    fail "timed out waiting for '$2' in $1"; screen "$1" | tail -15 | sed 's/^/  | /'; return 1
}
count() { screen "$1" | grep -c -- "$2"; }
start() { # start NAME ARGS...: the REPL in a 160x50 pane; its exit status is printed after it
    name=$1; shift
    tm new-session -d -s "$name" -x 160 -y 50 \
        "XDG_STATE_HOME='$XDG_STATE_HOME' '$EPYQ' chat -m '$M' -t 1 $*; echo EXIT=\$?; sleep 60"
}

# Session a: short greedy answers.
start a -n 8 --temp 0 --no-think
wait_for a 'epyq chat' && wait_for a '^> ' || finish
screen a | grep -q '^loaded .* GB in .* GB/s), 1 threads' && ok "load summary on the terminal" || fail "no load summary"
screen a | grep -q 'model_loaded' && fail "JSON load line on a terminal"
tm send-keys -t a 'Hello there' Enter
wait_for a '^\[ prompt .* t/s | generation .* t/s \]' && ok "answer streamed with stats line"
tm send-keys -t a '/regen' Enter
i=0; while [ "$(count a '^\[ prompt ')" -lt 2 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(count a '^\[ prompt ')" = 2 ] && ok "/regen answered again" || fail "/regen gave no second answer"
tm send-keys -t a '/clear' Enter
wait_for a '^\[ conversation cleared \]' && ok "/clear"
tm send-keys -t a '/stats' Enter
wait_for a '^context .* 0 of ' && ok "/stats after /clear shows an empty context"
tm send-keys -t a '/exit' Enter
wait_for a '^EXIT=0' && ok "/exit leaves with 0"
grep -q '^Hello' "$XDG_STATE_HOME/epyq/history" && ok "history persisted" || fail "no history file entry"

# Session b: a long sampled answer, interrupted. A 64k-row vocabulary makes the synthetic
# model slow enough to interrupt and its end-of-text token unlikely (1024 rows: ~1 in 300).
"$EPYQ" synth -o "$T/wide" --shape tiny --format ct --vocab 65536 -t 1 >/dev/null 2>&1 || fail "synth --vocab"
M="$T/wide"
start b -n 4000 --temp 1.5 --no-think
wait_for b '^> ' || finish
tm send-keys -t b 'Tell me a long story' Enter
sleep 0.5
# Streaming: text is on screen while no stats line is yet.
if [ "$(count b '^\[ prompt ')" = 0 ]; then ok "answer in progress"; else fail "answer finished before Ctrl-C (model too fast?)"; fi
tm send-keys -t b C-c
wait_for b 'stopped; the partial answer is kept' && ok "Ctrl-C stopped the answer"
wait_for b '^> ' 
screen b | grep -q '^EXIT=' && fail "the first Ctrl-C ended the REPL"
tm send-keys -t b '/stats' Enter
wait_for b '(cancelled)' && ok "REPL still answers after Ctrl-C"
tm send-keys -t b C-c
wait_for b '^EXIT=130' && ok "Ctrl-C while idle exits 130"
finish
