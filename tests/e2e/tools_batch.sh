#!/bin/sh
# `epyq batch` on a tiny synthetic checkpoint: OpenAI batch records in input order, error
# records for malformed / invalid / duplicate / over-long lines (the job goes on, exit 2),
# scripts/batch-per-node's merged shards equal one run, and SIGTERM mid-run followed by
# --resume giving the byte-identical file of an uninterrupted run (no timing fields), prefix
# reuse, and --spec mtp giving the plain records.
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
make_model
B="batch -m $M -t 1 -c 96 --max-batch 3"
long=$(printf 'word %.0s' $(seq 1 200))
{
    echo '{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":5,"seed":1}}'
    echo '{"custom_id":"b","method":"POST","url":"/v1/completions","body":{"prompt":"Once upon","max_tokens":4,"temperature":0}}'
    echo '{"custom_id":"c", this is not json'
    echo '{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"dup","max_tokens":2}}'
    echo "{\"custom_id\":\"long\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"$long\",\"max_tokens\":2}}"
    echo '{"custom_id":"badurl","method":"POST","url":"/v1/embeddings","body":{"input":"x"}}'
    echo '{"prompt":"plain form","max_tokens":3}'
} >"$T/in.jsonl"
expect 2 "batch with bad lines exits 2" "$EPYQ" $B -i "$T/in.jsonl" -o "$T/out.jsonl"
[ "$(wc -l <"$T/out.jsonl")" = 7 ] || fail "expected 7 output lines, got $(wc -l <"$T/out.jsonl")"
jq -e -s '
  (map(.custom_id) == ["a","b","line:3","a","long","badurl","line:7"]) and
  (.[0].response.status_code == 200 and .[0].error == null and
   .[0].response.body.object == "chat.completion" and
   (.[0].response.body.choices[0].message.role == "assistant") and
   .[0].response.body.usage.completion_tokens >= 1) and
  (.[1].response.body.object == "text_completion" and (.[1].response.body.choices[0].text | type) == "string") and
  (.[2].response.status_code == 400 and (.[2].error.code | type) == "string" and (.[2].error.message | length) > 0) and
  (.[3].error.code == "duplicate_custom_id") and
  (.[4].error.code == "context_length_exceeded") and
  (.[5].response.status_code == 400) and
  (.[6].response.status_code == 200 and .[6].response.body.usage.completion_tokens <= 3) and
  all(.[]; (.id | type) == "string" and has("response") and has("error"))
' "$T/out.jsonl" >/dev/null && ok "records, order and error codes" || { fail "record contents"; cat "$T/out.jsonl"; }
grep -q 'done' "$T/err" || fail "no progress/summary on stderr"
# scripts/batch-per-node: two shards (both on node 0 here) merge into the same file.
EPYQ="$EPYQ" "${srcdir:-.}/scripts/batch-per-node" --nodes 0,0 -i "$T/in.jsonl" -o "$T/nodes.jsonl" -- -m "$M" -t 1 -c 96 \
    --max-batch 3 >/dev/null 2>"$T/err"
rc=$?
[ $rc = 2 ] || fail "batch-per-node: exit $rc, expected 2 (some lines failed)"
cmp "$T/out.jsonl" "$T/nodes.jsonl" && ok "batch-per-node output = single run output" || fail "batch-per-node merge differs"

# SIGTERM then --resume: long enough that the signal lands mid-run. The resumed run decodes
# other requests together than the uninterrupted one; byte identity holds because no kernel's
# per-row result depends on the batch (tests/kern/test_w4.c test_rows_independent).
i=0
while [ $i -lt 24 ]; do
    printf '{"custom_id":"r%d","method":"POST","url":"/v1/completions","body":{"prompt":"Story %d:","max_tokens":48,"seed":%d}}\n' $i $i $i
    i=$((i + 1))
done >"$T/big.jsonl"
B="batch -m $M -t 1 -c 256 --max-batch 4"
expect 0 "uninterrupted run" "$EPYQ" $B -i "$T/big.jsonl" -o "$T/full.jsonl"
"$EPYQ" $B -i "$T/big.jsonl" -o "$T/part.jsonl" >/dev/null 2>"$T/err" &
pid=$!
# wait for the first record, then stop it
i=0; while [ ! -s "$T/part.jsonl" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
kill -TERM $pid; wait $pid; rc=$?
n=$(wc -l <"$T/part.jsonl")
if [ $rc = 143 ]; then ok "SIGTERM exits 143 with $n of 24 records"; elif [ $rc = 0 ]; then echo "note: the run finished before SIGTERM"; else fail "SIGTERM: exit $rc"; fi
# A torn last line (a crash mid-write) must be dropped by --resume.
printf '{"id":"batch_req_x","custom_id":"r' >>"$T/part.jsonl"
expect 0 "--resume" "$EPYQ" $B -i "$T/big.jsonl" -o "$T/part.jsonl" --resume
cmp "$T/full.jsonl" "$T/part.jsonl" && ok "resumed output is byte-identical" || fail "resumed output differs"
expect 0 "--resume of a complete file" "$EPYQ" $B -i "$T/big.jsonl" -o "$T/part.jsonl" --resume
cmp -s "$T/full.jsonl" "$T/part.jsonl" || fail "second --resume changed the file"

# Prefix reuse: requests sharing a long system prompt compute it once; the records equal those
# of --cache-mb 0 except usage.prompt_tokens_details.cached_tokens, which says what was reused.
sys=$(printf 'rule %d, ' $(seq 1 60))
i=0
while [ $i -lt 10 ]; do
    printf '{"custom_id":"p%d","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"system","content":"%s"},{"role":"user","content":"question %d"}],"max_completion_tokens":6,"seed":%d}}\n' $i "$sys" $i $i
    i=$((i + 1))
done >"$T/shared.jsonl"
B="batch -m $M -t 1 -c 1024 --max-batch 4 --cache-every 32"
expect 0 "shared prefix, cache off" "$EPYQ" $B --cache-mb 0 -i "$T/shared.jsonl" -o "$T/nocache.jsonl"
expect 0 "shared prefix, cache on" "$EPYQ" $B -i "$T/shared.jsonl" -o "$T/cache.jsonl"
grep -q 'cached [1-9]' "$T/err" || fail "the summary reports no cached prompt tokens: $(tail -1 "$T/err")"
jq -e -s 'all(.[]; .response.body.usage.prompt_tokens_details.cached_tokens == 0)' "$T/nocache.jsonl" >/dev/null ||
    fail "cached_tokens with --cache-mb 0"
jq -e -s '(.[0].response.body.usage.prompt_tokens_details.cached_tokens == 0) and
  all(.[1:][]; .response.body.usage.prompt_tokens_details.cached_tokens >= 32 and
      .response.body.usage.prompt_tokens_details.cached_tokens < .response.body.usage.prompt_tokens)' \
    "$T/cache.jsonl" >/dev/null && ok "usage.prompt_tokens_details.cached_tokens" ||
    { fail "cached_tokens"; jq -c '.response.body.usage' "$T/cache.jsonl"; }
strip='del(.[].response.body.usage.prompt_tokens_details)'
[ "$(jq -c -s "$strip" "$T/cache.jsonl")" = "$(jq -c -s "$strip" "$T/nocache.jsonl")" ] &&
    ok "records with the cache equal those without" || fail "the prefix cache changed the outputs"

# --spec mtp: each request drafts and verifies inside the shared steps (with the prefix cache
# on, so restored prompts draft too); greedy and seeded records equal the plain run's.
expect 0 "shared prefix, --spec mtp --draft 3" "$EPYQ" $B --spec mtp --draft 3 -i "$T/shared.jsonl" -o "$T/spec.jsonl"
grep -q 'spec mtp:3: [1-9][0-9]* verify steps' "$T/err" || fail "no speculative steps in the summary: $(tail -1 "$T/err")"
cmp "$T/cache.jsonl" "$T/spec.jsonl" && ok "--spec mtp records = plain records" || fail "--spec mtp changed the outputs"
# Images (image_url content parts, tools/media.c): the greedy text of a data-URL request equals
# `epyq run --chat --image` of the same message, also batched beside text requests with a small
# chunk and with --spec mtp (image requests run plainly); a local path only under
# --allowed-media-dir; bad data URLs, remote URLs and paths outside it get invalid_image records
# naming messages[i].content[j].image_url, and the job goes on.
mkdir -p "$T/media"
python3 - "$T/media/a.png" <<'PY' || { echo "python3 could not write the test PNG"; exit 1; }
import struct, sys, zlib
w, h = 40, 24
rows = b"".join(b"\0" + bytes(((x * 7 + y * 5 + c * 60) & 255) for x in range(w) for c in range(3)) for y in range(h))
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                              chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
PY
expect 0 "run --chat --image (reference)" "$EPYQ" run -m "$M" -t 1 -n 6 --temp 0 --chat --no-think --image "$T/media/a.png" -p "What is this?"
ref=$(cat "$T/out")
B64=$(base64 -w0 "$T/media/a.png")
img_line() { # ID URL
    printf '{"custom_id":"%s","method":"POST","url":"/v1/chat/completions","body":{"max_tokens":6,"temperature":0,"chat_template_kwargs":{"enable_thinking":false},"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"%s"}},{"type":"text","text":"What is this?"}]}]}}\n' "$1" "$2"
}
{
    echo '{"custom_id":"t1","method":"POST","url":"/v1/completions","body":{"prompt":"Once upon a time there","max_tokens":12,"temperature":0}}'
    img_line img "data:image/png;base64,$B64"
    echo '{"custom_id":"t2","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hi"}],"max_tokens":12,"temperature":0}}'
    img_line path "$T/media/a.png"
    img_line remote "https://example.com/a.png"
    img_line b64 "data:image/png;base64,@@@@"
    img_line notimg "data:image/png;base64,$(printf 'not an image' | base64 -w0)"
    img_line outside "$T/media/../in.jsonl"
} >"$T/img.jsonl"
for extra in "" "--spec mtp --draft 2"; do
    expect 2 "batch with images $extra" "$EPYQ" batch -m "$M" -t 1 -c 256 --max-batch 3 --chunk 16 $extra \
        --allowed-media-dir "$T/media" -i "$T/img.jsonl" -o "$T/img_out$extra.jsonl"
    o="$T/img_out$extra.jsonl"
    [ "$(jq -r 'select(.custom_id == "img") | .response.body.choices[0].message.content' "$o")" = "$ref" ] &&
        [ "$(jq -r 'select(.custom_id == "path") | .response.body.choices[0].message.content' "$o")" = "$ref" ] &&
        ok "batch image requests ($extra) = run --chat --image: $ref" || { fail "batch image text ($extra)"; cat "$o"; }
    jq -e -s 'map(select(.custom_id == "t1" or .custom_id == "t2") | .response.status_code == 200) == [true, true] and
        (map(select(.custom_id == "img")) | .[0].response.body.usage.prompt_tokens > 77) and
        (map(select(.error != null) | [.custom_id, .error.code, (.error.message | startswith("'"'"'messages[0].content[0].image_url'"'"'"))]) ==
         [["remote","invalid_image",true],["b64","invalid_image",true],["notimg","invalid_image",true],["outside","invalid_image",true]])' \
        "$o" >/dev/null && ok "batch image refusals name the field ($extra)" || { fail "batch image records ($extra)"; cat "$o"; }
done
# the text requests beside the images: their records' text as when run without them
grep -E '"custom_id":"t[12]"' "$T/img.jsonl" >"$T/txt.jsonl"
expect 0 "text requests alone" "$EPYQ" batch -m "$M" -t 1 -c 256 --max-batch 1 -i "$T/txt.jsonl" -o "$T/txt_out.jsonl"
txt() { jq -r 'select(.custom_id == "t1" or .custom_id == "t2") | .response.body.choices[0] | (.text // .message.content)' "$1"; }
[ "$(txt "$T/txt_out.jsonl")" = "$(txt "$T/img_out.jsonl")" ] && ok "text requests beside images: same text" ||
    fail "text requests beside images differ"
finish
