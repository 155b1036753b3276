#!/bin/sh
# `epyq run` and piped `epyq chat` on a tiny synthetic checkpoint: streaming output, stats
# lines, determinism under a fixed seed, and the REPL commands a script can drive.
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
make_model
R="run -m $M -t 1 -n 12 -s 7"
expect 0 "run raw prompt" "$EPYQ" $R -p "The quick brown fox"
cp "$T/out" "$T/run1"
grep '^{"event":"model_loaded"' "$T/err" | jq -e '.bytes > 0 and .threads == 1' >/dev/null &&
    ok "not a TTY: one JSON load line" || fail "no JSON load line on stderr"
grep -q 'generation 12 tokens\|finish: stop' "$T/err" || fail "run: no stats line with 12 generated tokens"
expect 0 "run again, same seed" "$EPYQ" $R -p "The quick brown fox"
cmp -s "$T/out" "$T/run1" || fail "run: same seed gave different text"
# the embedding table: copied into memory (a tiny model fits) unless EPYQ_EMBED=mapped; same text
grep '^{"event":"model_loaded"' "$T/err" | jq -e '.embeddings == "in memory"' >/dev/null ||
    fail "load line: embeddings not in memory"
expect 0 "run with EPYQ_EMBED=mapped" env EPYQ_EMBED=mapped "$EPYQ" $R -p "The quick brown fox"
grep '^{"event":"model_loaded"' "$T/err" | jq -e '.embeddings == "mapped"' >/dev/null ||
    fail "load line: EPYQ_EMBED=mapped not shown"
cmp -s "$T/out" "$T/run1" || fail "run: EPYQ_EMBED=mapped gave different text"
expect 1 "run with a bad EPYQ_EMBED" env EPYQ_EMBED=sometimes "$EPYQ" $R -p "The quick brown fox"
grep -q "EPYQ_EMBED: expected mapped or resident, got 'sometimes'" "$T/err" ||
    fail "bad EPYQ_EMBED: no clear error"
printf 'The quick brown fox' >"$T/prompt.txt"
expect 0 "run -f FILE" "$EPYQ" $R -f "$T/prompt.txt"
cmp -s "$T/out" "$T/run1" || fail "run -f gave other text than -p"
expect 0 "run --chat --no-think" "$EPYQ" $R --chat --no-think -p "Hi"
# MTP speculative decoding: the same text, greedy and sampled with the same seed, and its stats
expect 0 "run --spec mtp" "$EPYQ" $R --spec mtp --draft 3 -p "The quick brown fox"
cmp -s "$T/out" "$T/run1" || fail "run --spec mtp gave other text than plain decoding"
grep -q '^\[ spec mtp:3: [0-9]* steps, [0-9.]* tokens/step, accepted by position: [0-9. ]*\]$' "$T/err" ||
    fail "run --spec: no speculation stats line"
expect 0 "run --temp 0" "$EPYQ" $R --temp 0 -p "The quick brown fox"
cp "$T/out" "$T/greedy"
expect 0 "run --temp 0 --spec mtp" "$EPYQ" $R --temp 0 --spec mtp -p "The quick brown fox"
cmp -s "$T/out" "$T/greedy" || fail "run --spec mtp (greedy) gave other text than plain greedy"
expect 2 "run --draft 9" "$EPYQ" $R --spec mtp --draft 9 -p x
# --draft-vocab: drafts among the first ids only, the same text, named in the load line
expect 0 "run --spec mtp --draft-vocab 100" "$EPYQ" $R --spec mtp --draft-vocab 100 -p "The quick brown fox"
cmp -s "$T/out" "$T/run1" || fail "run --draft-vocab gave other text than plain decoding"
grep '^{"event":"model_loaded"' "$T/err" | jq -e '.draft_head == "int4" and .draft_vocab == 112' >/dev/null ||
    fail "load line does not name the cut draft head (100 ids round up to 112)"
expect 2 "run --draft-vocab 0" "$EPYQ" $R --spec mtp --draft-vocab 0 -p x
expect 1 "run --draft-vocab past the vocabulary" "$EPYQ" $R --spec mtp --draft-vocab 99999 -p x
grep -q 'draft vocabulary: expected 1\.\.' "$T/err" || fail "no one-line refusal naming the draft vocabulary"
expect 1 "run --draft-head bf16 --draft-vocab 100" "$EPYQ" $R --spec mtp --draft-head bf16 --draft-vocab 100 -p x
grep -q 'draft vocabulary 100: expected a draft head' "$T/err" || fail "--draft-vocab without a draft head not refused by name"
# chat --spec mtp: the same greedy answers turn after turn, speculation in /stats
printf 'Hello\n/stats\nAgain\n/exit\n' >"$T/in2"
"$EPYQ" chat -m "$M" -t 1 -n 6 --temp 0 --no-think <"$T/in2" >"$T/c_plain" 2>/dev/null || fail "chat (plain) for the spec check"
"$EPYQ" chat -m "$M" -t 1 -n 6 --temp 0 --no-think --spec mtp <"$T/in2" >"$T/c_spec" 2>/dev/null || fail "chat --spec mtp"
# (the prompt and cache lines differ: speculation neither restores nor copies prompt state)
[ "$(grep -v '^speculation\|^last answer\|^memory\|^context\|^prompt  \|^cache  ' "$T/c_spec")" = \
  "$(grep -v '^last answer\|^memory\|^context\|^prompt  \|^cache  ' "$T/c_plain")" ] || fail "chat --spec mtp answered differently"
grep -q '^speculation mtp:2, [0-9]* steps' "$T/c_spec" || fail "chat --spec mtp: no speculation line in /stats"
# --requant (shared by run, chat, batch and serve): the load line says what was requantised
expect 0 "run --requant lm_head=int8" "$EPYQ" $R --requant lm_head=int8 -p "The quick brown fox"
grep '^{"event":"model_loaded"' "$T/err" | jq -e '.requant_lm_head == "int8" and .requant_dense == "bf16"' >/dev/null ||
    fail "run --requant: the load line does not name the requantised lm_head"
expect 2 "run --requant bogus" "$EPYQ" $R --requant lm_head=int3 -p x
grep -q -- '--requant' "$T/err" || fail "run --requant bogus: the message does not name the flag"
expect 2 "run --spec eagle" "$EPYQ" $R --spec eagle -p x
expect 1 "run prompt past -c" "$EPYQ" $R -c 4 -p "a b c d e f g h i j k l m n o p"
grep -q '^epyq: .*context' "$T/err" || fail "run: over-long prompt message does not name the context"

# Piped chat: no banner or prompt, one line per turn, stats after each answer. Greedy, so
# /regen and a fresh turn after /clear must reproduce the first answer exactly.
C="chat -m $M -t 1 -n 6 -s 3 --temp 0 --no-think"
printf 'Hello\n/save %s\n/regen\n/save %s\n/clear\nHello\n/save %s\n/stats\n/exit\nnot reached\n' \
    "$T/c1.json" "$T/c2.json" "$T/conv.json" >"$T/in"
"$EPYQ" $C <"$T/in" >"$T/out" 2>"$T/err"; rc=$?
[ $rc = 0 ] || { fail "piped chat exit $rc"; cat "$T/err"; }
[ "$(grep -c '^\[ prompt .* t/s | generation .* t/s \]$' "$T/err")" = 3 ] || fail "piped chat: expected 3 answer stats lines"
grep -q '^\[ conversation cleared \]$' "$T/out" || fail "piped chat: /clear not acknowledged"
grep -q '^> ' "$T/out" && fail "piped chat printed a prompt decoration"
grep -q '^context ' "$T/out" || fail "piped chat: /stats printed nothing"
grep -q 'not reached' "$T/out" && fail "input after /exit was used"
for f in c1 c2 conv; do
    jq -e '.messages | length == 2 and .[0].role == "user" and .[1].role == "assistant"' "$T/$f.json" >/dev/null ||
        fail "/save $f: expected one user and one assistant message"
done
a1=$(jq -r '.messages[1].content' "$T/c1.json"); a2=$(jq -r '.messages[1].content' "$T/c2.json")
a3=$(jq -r '.messages[1].content' "$T/conv.json")
[ -n "$a1" ] && [ "$a1" = "$a2" ] && [ "$a1" = "$a3" ] || fail "greedy answers differ: '$a1' / '$a2' / '$a3'"
# The streamed text is the saved answer.
grep -qF "$(printf '%s' "$a1" | head -1)" "$T/out" || fail "the saved answer was not streamed to stdout"
# /load restores the conversation; a follow-up turn works from it.
printf '/load %s\nAnd then?\n' "$T/conv.json" | "$EPYQ" $C >"$T/out" 2>"$T/err" || fail "chat after /load failed"
grep -q '^\[ loaded 2 messages \]$' "$T/out" || fail "/load not acknowledged"
printf '/load %s\n' "$T/prompt.txt" | "$EPYQ" $C >"$T/out" 2>"$T/err"
grep -q '^epyq: .*prompt.txt' "$T/err" || fail "/load of a non-conversation file: no one-line error"
# /read puts a file before the next message; sampled /regen draws a new answer.
printf 'line one\nline two\n' >"$T/notes.txt"
printf '/read %s\nSummarise\n/save %s\n/regen\n/save %s\n' "$T/notes.txt" "$T/r1.json" "$T/r2.json" |
    "$EPYQ" chat -m "$M" -t 1 -n 24 -s 1 --temp 1.5 --no-think >"$T/out" 2>"$T/err" || fail "chat with /read"
[ "$(jq -r '.messages[0].content' "$T/r1.json")" = "$(printf -- '--- File: notes.txt ---\nline one\nline two\n\nSummarise')" ] &&
    ok "/read text before the message" || { fail "/read"; jq . "$T/r1.json"; }
[ "$(jq -r '.messages[1].content' "$T/r1.json")" != "$(jq -r '.messages[1].content' "$T/r2.json")" ] &&
    ok "sampled /regen gives another answer" || fail "sampled /regen repeated the answer"

# Suffix feeding: with a template that re-renders earlier turns exactly as they were fed
# (Qwen's drops old reasoning, which forces a full re-feed), later turns feed only the new
# tokens: the last answer's prompt is shorter than the context in use.
cp -r "$M" "$T/plain"
printf '%s' '{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}' >"$T/plain/chat_template.jinja"
printf 'Hello\nMore please\nAgain\n/stats\n' | "$EPYQ" chat -m "$T/plain" -t 1 -n 6 --temp 0 >"$T/out" 2>"$T/err" || fail "chat on the plain template"
used=$(sed -n 's/^context *\([0-9]*\) of.*/\1/p' "$T/out"); fed=$(sed -n 's/^last answer prompt \([0-9]*\) tokens.*/\1/p' "$T/out")
[ -n "$used" ] && [ -n "$fed" ] && [ "$fed" -lt $((used / 2)) ] && ok "third turn fed $fed of $used tokens" ||
    fail "no suffix feeding: fed '$fed' of '$used'"
finish
