#!/bin/sh
# `epyq serve` driven with curl on a tiny synthetic checkpoint: models, health, chat and
# completions (non-streaming = streaming text at temperature 0 and at a fixed seed), echo and
# logprobs, stop strings, 16 concurrent streams, an aborted stream followed by healthy requests
# (its sequence freed), every bad-input case answering an OpenAI-style 400 naming the field,
# 401/404/405/413/429, metrics, and SIGTERM during a stream (the stream completes, exit 0).
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
. "${srcdir:-.}/tests/e2e/serve_lib.sh"
command -v curl >/dev/null || { echo "no curl"; exit 77; }
"$EPYQ" serve --help >"$T/out" 2>&1 || { echo "epyq serve is not built (no libmicrohttpd)"; exit 77; }
grep -q usage "$T/out" || fail "serve --help prints no usage"
expect 2 "serve --no-such-option" "$EPYQ" serve --no-such-option
[ "$(wc -l <"$T/err")" = 1 ] || fail "serve usage error is not one line"
expect 2 "serve without a model" "$EPYQ" serve --port 0
make_model
start_server main -m "$M" -t 1 -c 4096 --parallel 4 --max-queue 32
MAIN=$SPID MAIN_URL=$URL
HI='"messages":[{"role":"user","content":"Hi there"}]'

[ "$(curl -s -m 10 "$URL/health" | jq -r .status)" = ok ] && ok "health" || fail "health"
curl -s -m 10 "$URL/v1/models" | jq -e '.object == "list" and .data[0].id == "tiny" and .data[0].object == "model"' >/dev/null \
    && ok "models list names the folder" || fail "models list"
[ "$(curl -s -m 10 "$URL/v1/models/tiny" | jq -r .id)" = tiny ] && ok "models/{id}" || fail "models/{id}"
[ "$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$URL/v1/models/other")" = 404 ] && ok "models/{unknown}: 404" || fail "models/{unknown}"

# Non-streaming vs streaming: the same text at temperature 0, and at a fixed seed.
for mode in '"temperature":0' '"temperature":0.9,"seed":42'; do
    s=$(post /v1/chat/completions "{$HI,\"max_tokens\":24,$mode}")
    [ "$s" = 200 ] || fail "chat ($mode): HTTP $s"
    jq -e '.object == "chat.completion" and .choices[0].message.role == "assistant" and .usage.completion_tokens == 24 and
           .usage.prompt_tokens > 0 and .choices[0].finish_reason == "length"' "$T/body" >/dev/null || { fail "chat body ($mode)"; cat "$T/body"; }
    want=$(jq -r '.choices[0].message | (.reasoning_content // "") + "|" + (.content // "")' "$T/body")
    curl -sN -m 60 "$URL/v1/chat/completions" -d "{$HI,\"max_tokens\":24,$mode,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" >"$T/sse"
    tail -n 2 "$T/sse" | grep -q '^data: \[DONE\]$' || fail "stream ($mode) does not end with [DONE]"
    sed -n 's/^data: //p' "$T/sse" | grep -v '^\[DONE\]$' >"$T/chunks"
    got=$(jq -s -r '[.[].choices[0].delta.reasoning_content // empty] | join("")' "$T/chunks")"|"$(jq -s -r '[.[].choices[0].delta.content // empty] | join("")' "$T/chunks")
    [ "$got" = "$want" ] && ok "stream = non-stream text ($mode)" || { fail "stream text differs ($mode)"; echo "  want: $want"; echo "  got:  $got"; }
    jq -s -e '(.[0].choices[0].delta.role == "assistant") and (.[-1].usage.completion_tokens == 24) and (.[-1].choices == []) and
              ([.[].choices[0].finish_reason // empty] == ["length"])' "$T/chunks" >/dev/null \
        && ok "stream role, finish and usage chunks ($mode)" || fail "stream chunk shape ($mode)"
done

# Content-part arrays render like the string; completions; echo + logprobs; chat logprobs.
post /v1/chat/completions '{"messages":[{"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}]}],"max_tokens":4,"temperature":0}' >/dev/null
jq -e '.usage.prompt_tokens > 0' "$T/body" >/dev/null && ok "content-part array" || fail "content-part array"
s=$(post /v1/completions '{"prompt":"Once upon a time","max_tokens":6,"temperature":0,"logprobs":3,"echo":true}')
jq -e --arg p "Once upon a time" '.object == "text_completion" and (.choices[0].text | startswith($p)) and
    .choices[0].logprobs.token_logprobs[0] == null and (.choices[0].logprobs.tokens | length) == .usage.prompt_tokens + 6 and
    (.choices[0].logprobs.top_logprobs[1] | length) >= 1 and all(.choices[0].logprobs.token_logprobs[1:][]; . <= 0)' "$T/body" >/dev/null \
    && ok "completions echo + logprobs" || { fail "completions echo + logprobs ($s)"; cat "$T/body"; }
post /v1/chat/completions "{$HI,\"max_tokens\":5,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}" >/dev/null
jq -e '(.choices[0].logprobs.content | length) == 5 and all(.choices[0].logprobs.content[]; (.top_logprobs | length) == 2 and
       .logprob <= 0 and (.bytes | type) == "array")' "$T/body" >/dev/null && ok "chat logprobs" || { fail "chat logprobs"; cat "$T/body"; }
curl -sN -m 60 "$URL/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":6,"temperature":0,"stream":true}' |
    sed -n 's/^data: //p' | grep -v '^\[DONE\]$' | jq -s -r '[.[].choices[0].text] | join("")' >"$T/cs"
post /v1/completions '{"prompt":"Once upon a time","max_tokens":6,"temperature":0}' >/dev/null
[ "$(cat "$T/cs")" = "$(jq -r '.choices[0].text' "$T/body")" ] && ok "completions stream = non-stream" || fail "completions stream text"

# Tools reach the template (the prompt grows by their description); thinking can be switched off.
post /v1/chat/completions "{$HI,\"max_tokens\":2}" >/dev/null
n0=$(jq .usage.prompt_tokens "$T/body")
s=$(post /v1/chat/completions "{$HI,\"max_tokens\":2,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}],\"tool_choice\":\"auto\"}")
[ "$s" = 200 ] && [ "$(jq .usage.prompt_tokens "$T/body")" -gt $((n0 + 20)) ] && ok "tools rendered into the prompt" || fail "tools: HTTP $s"
post /v1/chat/completions "{$HI,\"max_tokens\":2,\"chat_template_kwargs\":{\"enable_thinking\":false}}" >/dev/null
[ "$(jq .usage.prompt_tokens "$T/body")" -gt "$n0" ] && ok "enable_thinking false (closed think block in the prompt)" || fail "enable_thinking"

# Prefix reuse: the same long prompt again (plus a word) starts from the first one's copy.
long=$(printf 'rule %d, ' $(seq 1 150))
post /v1/completions "{\"prompt\":\"$long\",\"max_tokens\":4,\"temperature\":0}" >/dev/null
c0=$(jq .usage.prompt_tokens_details.cached_tokens "$T/body")
post /v1/completions "{\"prompt\":\"$long end\",\"max_tokens\":4,\"temperature\":0}" >/dev/null
c1=$(jq .usage.prompt_tokens_details.cached_tokens "$T/body")
[ "$c0" = 0 ] && [ "$c1" -ge 256 ] && ok "usage.prompt_tokens_details.cached_tokens ($c0, then $c1)" ||
    fail "cached_tokens: $c0 then $c1: $(jq -c .usage "$T/body")"

# Stop strings: cut at the first occurrence, finish_reason stop, the string itself dropped.
post /v1/completions '{"prompt":"Story:","max_tokens":40,"temperature":0}' >/dev/null
full=$(jq -r '.choices[0].text' "$T/body")
stop=$(jq -r '.choices[0].text[9:12]' "$T/body")
if [ -n "$stop" ]; then
    post /v1/completions "$(jq -cn --arg s "$stop" '{prompt:"Story:",max_tokens:40,temperature:0,stop:[$s]}')" >/dev/null
    got=$(jq -r '.choices[0].text' "$T/body")
    case "$got" in *"$stop"*) fail "stop string kept in the output";; esac
    [ "$(jq -r '.choices[0].finish_reason' "$T/body")" = stop ] && case "$full" in "$got$stop"*) true;; *) false;; esac \
        && ok "stop string" || fail "stop string: full '$full' stop '$stop' got '$got'"
fi

# 16 concurrent streams, all complete.
i=0 CURLS=""
while [ $i -lt 16 ]; do
    curl -sN -m 120 "$URL/v1/chat/completions" -d "{$HI,\"max_tokens\":16,\"seed\":$i,\"temperature\":0.7,\"stream\":true}" >"$T/c$i" &
    CURLS="$CURLS $!"
    i=$((i + 1))
done
wait_curls() { for p in $CURLS; do wait "$p"; done; CURLS=""; }
wait_curls
n=0; i=0
while [ $i -lt 16 ]; do tail -n 2 "$T/c$i" | grep -q '^data: \[DONE\]$' && n=$((n + 1)); i=$((i + 1)); done
[ $n = 16 ] && ok "16 concurrent streams complete" || fail "only $n of 16 concurrent streams completed"

# An aborted stream and an aborted plain request: each is cancelled and its sequence freed;
# healthy requests follow. The tiny model decodes thousands of tokens a second, so both run
# on make_long_model's copy, asked for 60000 tokens with ignore_eos: neither can finish
# before its client goes, on any machine. The stream is cut by head after
# its first bytes; the plain request's curl is killed once the server reports it running.
make_long_model
start_server long -m "$T/long" -t 1 -c 65536 --parallel 2 --max-queue 4
LONG=$SPID
metric() { curl -s -m 10 "$URL/metrics" | sed -n "s/^$1 //p"; }
LB='"max_tokens":60000,"ignore_eos":true'
curl -sN -m 60 "$URL/v1/completions" -d "{\"prompt\":\"Long\",$LB,\"stream\":true}" 2>/dev/null | head -c 200 >/dev/null
# The stream must be seen cancelled before the plain request starts: otherwise "running 1"
# below can be the stream itself, and the plain curl is killed before the server has seen it
# (on a loaded machine it then never counts as cancelled).
i=0
while [ $i -lt 500 ] && [ "$(metric epyq_requests_cancelled_total)" != 1 ]; do sleep 0.02; i=$((i + 1)); done
curl -s -m 60 "$URL/v1/completions" -d "{\"prompt\":\"Long\",$LB}" >/dev/null 2>&1 &
CP=$!
i=0 # until the plain request generates
while [ $i -lt 500 ] && [ "$(metric epyq_requests_running)" != 1 ]; do sleep 0.02; i=$((i + 1)); done
kill "$CP" 2>/dev/null
wait "$CP" 2>/dev/null
i=0 # until both are seen gone
while [ $i -lt 500 ]; do
    curl -s -m 10 "$URL/metrics" >"$T/metrics"
    grep -q '^epyq_requests_running 0$' "$T/metrics" && grep -q '^epyq_requests_cancelled_total 2$' "$T/metrics" &&
        grep -q '^epyq_kv_bytes_in_use 0$' "$T/metrics" && break
    sleep 0.02; i=$((i + 1))
done
grep -q '^epyq_requests_running 0$' "$T/metrics" && grep -q '^epyq_kv_bytes_in_use 0$' "$T/metrics" &&
    grep -q '^epyq_requests_cancelled_total 2$' "$T/metrics" \
    && ok "aborted stream and request cancelled, sequences freed" || { fail "abort: not cancelled"; grep -v '^#' "$T/metrics"; }
[ "$(post /v1/chat/completions "{$HI,\"max_tokens\":3}")" = 200 ] && ok "healthy request after aborts" || fail "request after aborts"
stop_server $LONG
[ "$RC" = 0 ] && ok "long-context server: SIGTERM exit 0" || fail "long-context server: exit $RC"
URL=$MAIN_URL

# Bad input: status, error.param and error.code; never a crash or a hung connection.
bad() { # STATUS PARAM PATH BODY [curl args]
    want=$1 param=$2 path=$3 body=$4; shift 4
    s=$(post "$path" "$body" "$@")
    if [ "$s" = "$want" ] && jq -e --arg p "$param" '(.error.message | length) > 0 and (.error.type | type) == "string" and
        ((.error.param // "") == $p)' "$T/body" >/dev/null; then ok "$want $param: $(jq -r .error.message "$T/body" | cut -c 1-70)"
    else fail "$body -> HTTP $s $(cat "$T/body")"; fi
}
C=/v1/chat/completions
bad 400 "" $C '{"messages": [ {"role"'
bad 400 "" $C '[1,2,3]'
bad 400 messages $C '{"messages":"hello"}'
bad 400 messages $C '{"messages":[]}'
bad 400 messages $C '{"model":"tiny"}'
bad 400 'messages[0].role' $C '{"messages":[{"role":"wizard","content":"x"}]}'
bad 400 'messages[0].content' $C '{"messages":[{"role":"user","content":5}]}'
bad 400 'messages[0].content[0].image_url' $C '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x"}}]}]}'
bad 400 temperature $C "{$HI,\"temperature\":\"hot\"}"
bad 400 temperature $C "{$HI,\"temperature\":7}"
bad 400 max_tokens $C "{$HI,\"max_tokens\":0}"
bad 400 max_tokens $C "{$HI,\"max_tokens\":1.5}"
bad 400 top_k $C "{$HI,\"top_k\":\"5\"}"
bad 400 stream $C "{$HI,\"stream\":\"yes\"}"
bad 400 n $C "{$HI,\"n\":2}"
bad 400 response_format $C "{$HI,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{}}}}"
bad 400 tool_choice $C "{$HI,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\"}"
bad 400 'tools[0].function.name' $C "{$HI,\"tools\":[{\"type\":\"function\",\"function\":{}}]}"
bad 400 logit_bias $C "{$HI,\"logit_bias\":{\"5\":10}}"
bad 400 top_logprobs $C "{$HI,\"top_logprobs\":3}"
bad 400 stop $C "{$HI,\"stop\":[1]}"
bad 400 chat_template_kwargs.enable_thinking $C "{$HI,\"chat_template_kwargs\":{\"enable_thinking\":\"no\"}}"
bad 404 model $C "{$HI,\"model\":\"gpt-4\"}"
long=$(printf 'word %.0s' $(seq 1 4200))
bad 400 messages $C "{\"messages\":[{\"role\":\"user\",\"content\":\"$long\"}]}"
[ "$(jq -r .error.code "$T/body")" = context_length_exceeded ] || fail "long prompt: code $(jq -r .error.code "$T/body")"
bad 400 max_tokens $C "{$HI,\"max_tokens\":4090}"
bad 400 prompt /v1/completions '{"prompt":5}'
bad 400 prompt /v1/completions '{"prompt":["a","b"]}'
bad 400 best_of /v1/completions '{"prompt":"a","best_of":3}'
bad 400 suffix /v1/completions '{"prompt":"a","suffix":"z"}'
bad 400 logprobs /v1/completions '{"prompt":"a","logprobs":99}'
bad 405 "" $C '{}' -X GET
bad 404 "" /v1/embeddings '{"input":"x"}'
head -c 9000000 /dev/zero | tr '\0' ' ' >"$T/big.json"
s=$(curl -s -m 30 -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$T/big.json" "$URL$C")
[ "$s" = 413 ] && jq -e '.error.code == "request_too_large"' "$T/body" >/dev/null && ok "413 body over --max-body" || fail "big body: HTTP $s"
[ "$(post $C "{$HI,\"max_tokens\":2,\"unknown_field\":{\"x\":1},\"user\":\"u\",\"parallel_tool_calls\":true}")" = 200 ] \
    && ok "unknown fields ignored" || fail "unknown fields: $(cat "$T/body")"
[ "$(curl -s -m 10 "$URL/health" | jq -r .status)" = ok ] && ok "still healthy after the bad inputs" || fail "server died on bad input"

curl -s -m 10 "$URL/metrics" >"$T/metrics"
for k in epyq_requests_total epyq_prompt_tokens_total epyq_generation_tokens_total epyq_queue_depth \
    epyq_prompt_tokens_per_second epyq_decode_tokens_per_second epyq_kv_bytes_in_use \
    epyq_prompt_cached_tokens_total epyq_prefix_cache_bytes epyq_prefix_cache_entries epyq_prefix_cache_evictions_total; do
    grep -q "^$k" "$T/metrics" || fail "metrics: no $k"
done
grep -q '^epyq_requests_total{endpoint="/v1/chat/completions",status="400"}' "$T/metrics" && ok "metrics" || fail "metrics: no 400 count"
[ "$(sed -n 's/^epyq_prompt_cached_tokens_total //p' "$T/metrics")" -ge 256 ] && ok "metrics: cached prompt tokens" ||
    fail "metrics: epyq_prompt_cached_tokens_total"
stop_server $MAIN
[ "$RC" = 0 ] && ok "SIGTERM when idle: exit 0" || fail "SIGTERM when idle: exit $RC"

# --api-key, --served-model-name; a full queue answers 429 with Retry-After.
start_server keyed -m "$M" -t 1 -c 2048 --parallel 1 --max-queue 1 --api-key sekret --served-model-name toy
KEYED=$SPID
[ "$(post $C "{$HI,\"max_tokens\":2}")" = 401 ] && jq -e '.error.type == "authentication_error"' "$T/body" >/dev/null \
    && ok "401 without the key" || fail "no key: $(cat "$T/body")"
[ "$(post $C "{$HI,\"max_tokens\":2,\"model\":\"toy\"}" -H 'Authorization: Bearer sekret')" = 200 ] && ok "200 with the key" || fail "with key"
[ "$(curl -s -m 10 -H 'Authorization: Bearer sekret' "$URL/v1/models" | jq -r '.data[0].id')" = toy ] && ok "--served-model-name" || fail "served name"
L="{$HI,\"max_tokens\":2000,\"ignore_eos\":true,\"stream\":true}"
curl -sN -m 60 -H 'Authorization: Bearer sekret' "$URL$C" -d "$L" >"$T/q1" &
CURLS="$!"
curl -sN -m 60 -H 'Authorization: Bearer sekret' "$URL$C" -d "$L" >"$T/q2" &
CURLS="$CURLS $!"
i=0 # until one runs and one waits
while [ $i -lt 100 ] && ! curl -s -m 5 "$URL/metrics" | grep -q '^epyq_queue_depth 1$'; do sleep 0.02; i=$((i + 1)); done
s=$(curl -s -m 10 -D "$T/hdr" -o "$T/body" -w '%{http_code}' -H 'Authorization: Bearer sekret' "$URL$C" -d "{$HI,\"max_tokens\":2}")
[ "$s" = 429 ] && grep -qi '^retry-after:' "$T/hdr" && jq -e '.error.code == "queue_full"' "$T/body" >/dev/null \
    && ok "429 + Retry-After on a full queue" || fail "full queue: HTTP $s $(cat "$T/body")"
# SIGTERM while both stream: they finish within the grace period, the server exits 0.
stop_server $KEYED
rc=$RC
wait_curls
[ "$rc" = 0 ] && ok "SIGTERM during streaming: exit 0" || fail "SIGTERM during streaming: exit $rc"
for f in q1 q2; do
    tail -n 2 "$T/$f" | grep -q '^data: \[DONE\]$' && grep -q '"finish_reason":"length"' "$T/$f" \
        && ok "in-flight stream $f finished after SIGTERM" || { fail "stream $f cut by SIGTERM"; tail -c 400 "$T/$f"; cat "$T/keyed.err"; }
done
grep -q '"event":"stopped"' "$T/keyed.err" || fail "no stopped event"
finish
