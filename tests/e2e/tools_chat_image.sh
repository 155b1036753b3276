#!/bin/sh
# `/image FILE` in `epyq chat`, piped, greedy, on the tiny model with its BF16 tower:
#   - the first answer to a message with an image equals `epyq run --chat --image` of it;
#   - the next turn (the image stays in the history) equals `epyq serve`'s answer to the same
#     conversation sent as messages with an image_url part (when serve is built), with the
#     prefix cache on and off (copies never restored past an image, none filled);
#   - a bad file is refused in one line and the chat goes on; /clear forgets the image (the
#     next answer is a fresh chat's); --session is not saved with images, saying so.
command -v jq >/dev/null 2>&1 || { echo "jq missing: skipped"; exit 77; }
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
make_model
python3 - "$T/a.png" <<'PY' || { echo "python3 could not write the test PNG"; exit 1; }
import struct, sys, zlib
w, h = 40, 24
rows = b"".join(b"\0" + bytes(((x * 7 + y * 5 + c * 60) & 255) for x in range(w) for c in range(3)) for y in range(h))
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
open(sys.argv[1], "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                              chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
PY
chat() { "$EPYQ" chat -m "$M" -t 1 -n 8 --temp 0 --no-think "$@"; }
expect 0 "run --chat --image (reference)" "$EPYQ" run -m "$M" -t 1 -n 8 --temp 0 --chat --no-think --image "$T/a.png" -p "What is this?"
ref=$(cat "$T/out")
for cache in 1024 0; do
    printf '/image %s\nWhat is this?\nAnd now?\n' "$T/a.png" | chat --cache-mb $cache >"$T/chat$cache" 2>"$T/err$cache" ||
        fail "chat with an image (cache $cache): $(cat "$T/err$cache")"
    [ "$(sed -n 1p "$T/chat$cache")" = "$ref" ] && ok "chat /image first answer = run --chat --image (cache $cache)" ||
        fail "chat /image (cache $cache): '$(sed -n 1p "$T/chat$cache")', expected '$ref'"
    grep -q '^\[ image .*: 77 image tokens' "$T/err$cache" || fail "no image line: $(cat "$T/err$cache")"
    [ "$(grep -c '^\[ prompt [0-9]* computed + 0 cached' "$T/err$cache")" = 2 ] ||
        fail "a prompt with an image restored a cached copy: $(grep '^\[ prompt' "$T/err$cache")"
done
cmp -s "$T/chat1024" "$T/chat0" && ok "the same conversation with the prefix cache on and off" || fail "cache on/off differ"
# the second turn against the server's answer to the same conversation
if "$EPYQ" serve --help >/dev/null 2>&1 && command -v curl >/dev/null; then
    . "${srcdir:-.}/tests/e2e/serve_lib.sh"
    start_server chat -m "$M" -t 1
    jq -n --arg u "data:image/png;base64,$(base64 -w0 "$T/a.png")" --arg a1 "$(sed -n 1p "$T/chat1024")" \
        '{max_tokens: 8, temperature: 0, chat_template_kwargs: {enable_thinking: false}, messages: [
          {role: "user", content: [{type: "image_url", image_url: {url: $u}}, {type: "text", text: "What is this?"}]},
          {role: "assistant", content: $a1}, {role: "user", content: "And now?"}]}' >"$T/conv.json"
    got=$(curl -s -m 60 "$URL/v1/chat/completions" --data-binary @"$T/conv.json" | jq -r '.choices[0].message.content')
    # the first answer is one line here; the second is the rest of the output
    [ "$got" = "$(sed -n '2,$p' "$T/chat1024")" ] && ok "second turn = serve's answer to the conversation" ||
        fail "second turn '$(sed -n '2,$p' "$T/chat1024")', serve '$got'"
    stop_server "$SPID"
else
    echo "skip: no epyq serve (the second-turn check)"
fi
# refusals and /clear
printf 'not an image' >"$T/bad.png"
printf '/image %s\n/image %s\n/clear\nWhat is this?\n' "$T/bad.png" "$T/a.png" | chat >"$T/out" 2>"$T/err" || fail "chat after a bad image: $(cat "$T/err")"
grep -q "^epyq: $T/bad.png: unsupported format" "$T/err" && ok "bad image refused in one line" || fail "bad image: $(cat "$T/err")"
printf 'What is this?\n' | chat >"$T/fresh" 2>/dev/null
grep -v '^\[ conversation cleared \]$' "$T/out" | cmp -s - "$T/fresh" && ok "/clear forgets the image" || fail "/clear kept the image: $(cat "$T/out") vs $(cat "$T/fresh")"
printf '/image %s\nWhat is this?\n' "$T/a.png" | chat --session "$T/s.epyq" >"$T/out" 2>"$T/err"
grep -q "sessions do not keep images" "$T/err" && [ ! -e "$T/s.epyq" ] && ok "--session not saved with images" ||
    fail "session with images: $(cat "$T/err")"
finish
