#!/bin/sh
# Images through `epyq serve` (docs/vision.md) on a tiny synthetic checkpoint with its BF16 tower:
# a chat request with an image_url data URL (PNG, and the same image as JPEG when ImageMagick
# or PIL can write one) gives at temperature 0 the text of `epyq run --chat --image` for the same message, alone
# and while two text requests share its steps with a small prompt chunk; a local path works
# only under --allowed-media-dir; bad data URLs, remote URLs, paths outside the folder, a
# checkpoint without a tower answer OpenAI-style 400s naming
# messages[i].content[j].image_url; the server stays healthy.
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
. "${srcdir:-.}/tests/e2e/serve_lib.sh"
command -v curl >/dev/null || { echo "no curl"; exit 77; }
"$EPYQ" serve --help >"$T/out" 2>&1 || { echo "epyq serve is not built (no libmicrohttpd)"; exit 77; }
make_model
mkdir -p "$T/media"
python3 - "$T" <<'PY' || { echo "python3 could not write the test PNG"; exit 1; }
import struct, sys, zlib
def png(path, w, h, seed):
    rows = b"".join(b"\0" + bytes(((x * 7 + y * 5 + c * 60 + seed) & 255) for x in range(w) for c in range(3)) for y in range(h))
    def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                           chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
png(sys.argv[1] + "/media/a.png", 40, 24, 0)
PY
cp "$T/media/a.png" "$T/outside.png"
Q="What is this?"
expect 0 "run --chat --image (reference)" "$EPYQ" run -m "$M" -t 1 -n 8 --temp 0 --chat --no-think --image "$T/media/a.png" -p "$Q"
ref=$(cat "$T/out")
# body URL: a chat request with one image part and the question
body() {
    printf '{"max_tokens":8,"temperature":0,"chat_template_kwargs":{"enable_thinking":false},"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"%s"}},{"type":"text","text":"%s"}]}]}' "$1" "$Q"
}
B64=$(base64 -w0 "$T/media/a.png")
body "data:image/png;base64,$B64" >"$T/req.json"
start_server main -m "$M" -t 1 -c 4096 --parallel 3 --chunk 16 --allowed-media-dir "$T/media"
MAIN=$SPID
s=$(curl -s -m 60 -o "$T/body" -w '%{http_code}' "$URL/v1/chat/completions" --data-binary @"$T/req.json")
got=$(jq -r '.choices[0].message.content' "$T/body")
[ "$s" = 200 ] && [ "$got" = "$ref" ] && ok "image_url data URL = run --chat --image: $got" ||
    fail "data URL: HTTP $s, got '$got', expected '$ref' ($(cat "$T/body"))"
jq -e '.usage.prompt_tokens > 77 and .usage.prompt_tokens_details.cached_tokens == 0' "$T/body" >/dev/null &&
    ok "usage counts the 77 image tokens, nothing cached" || fail "usage: $(jq -c .usage "$T/body")"
# the same with two text requests in its steps (chunk 16 cuts the image's run)
PIDS=""
for i in 1 2; do
    curl -s -m 60 -o "$T/text$i" "$URL/v1/chat/completions" -d '{"max_tokens":24,"temperature":0,"messages":[{"role":"user","content":"tell me a long story please"}]}' &
    PIDS="$PIDS $!"
done
curl -s -m 60 -o "$T/body2" "$URL/v1/chat/completions" --data-binary @"$T/req.json"
for p in $PIDS; do wait "$p"; done # not the server's
[ "$(jq -r '.choices[0].message.content' "$T/body2")" = "$ref" ] && ok "image request batched with text ones: same text" ||
    fail "batched: $(cat "$T/body2")"
[ "$(jq -r '.choices[0].finish_reason' "$T/text1")" = length ] || fail "text request beside the image: $(cat "$T/text1")"
# streaming: the same text
sed 's/"max_tokens":8,/"max_tokens":8,"stream":true,/' "$T/req.json" >"$T/req_s.json"
curl -sN -m 60 "$URL/v1/chat/completions" --data-binary @"$T/req_s.json" | sed -n 's/^data: //p' | grep -v '^\[DONE\]$' >"$T/chunks"
[ "$(jq -s -r '[.[].choices[0].delta.content // empty] | join("")' "$T/chunks")" = "$ref" ] && ok "streamed image request: same text" ||
    fail "stream: $(cat "$T/chunks")"
# a local path under --allowed-media-dir
body "$T/media/a.png" >"$T/req_p.json"
s=$(curl -s -m 60 -o "$T/body" -w '%{http_code}' "$URL/v1/chat/completions" --data-binary @"$T/req_p.json")
[ "$s" = 200 ] && [ "$(jq -r '.choices[0].message.content' "$T/body")" = "$ref" ] && ok "local path under --allowed-media-dir" ||
    fail "local path: HTTP $s $(cat "$T/body")"
# the same picture as a JPEG (ImageMagick or PIL, whichever is there): the text of run --image on it
convert "$T/media/a.png" -quality 95 "$T/a.jpg" 2>/dev/null ||
    python3 -c 'import sys; from PIL import Image; Image.open(sys.argv[1]).save(sys.argv[2], quality=95)' \
        "$T/media/a.png" "$T/a.jpg" 2>/dev/null || rm -f "$T/a.jpg"

if [ -f "$T/a.jpg" ]; then
    "$EPYQ" run -m "$M" -t 1 -n 8 --temp 0 --chat --no-think --image "$T/a.jpg" -p "$Q" >"$T/want_j" 2>"$T/err" || fail "run --image a.jpg: $(cat "$T/err")"
    body "data:image/jpeg;base64,$(base64 -w0 "$T/a.jpg")" >"$T/req_j.json"
    s=$(curl -s -m 60 -o "$T/body" -w '%{http_code}' "$URL/v1/chat/completions" --data-binary @"$T/req_j.json")
    [ "$s" = 200 ] && [ "$(jq -r '.choices[0].message.content' "$T/body")" = "$(cat "$T/want_j")" ] &&
        ok "image/jpeg data URL = run --chat --image a.jpg" || fail "jpeg: HTTP $s $(cat "$T/body")"
else
    echo "skip: neither ImageMagick nor PIL (the JPEG data URL)"
fi
# refusals
P='messages[0].content[0].image_url'
bad_url() { # URL WHAT GREP
    body "$1" >"$T/req_b.json"
    s=$(curl -s -m 60 -o "$T/body" -w '%{http_code}' "$URL/v1/chat/completions" --data-binary @"$T/req_b.json")
    if [ "$s" = 400 ] && jq -e --arg p "$P" '.error.param == $p and .error.type == "invalid_request_error"' "$T/body" >/dev/null &&
        jq -r .error.message "$T/body" | grep -q "$3"; then ok "400 $2: $(jq -r .error.message "$T/body" | cut -c 1-90)"
    else fail "$2: HTTP $s $(cat "$T/body")"; fi
}
bad_url "http://example.com/a.png" "remote URL" "not fetched"
bad_url "https://example.com/a.png" "https URL" "not fetched"
bad_url "data:image/png;base64,@@@@" "bad base64" "base64"
bad_url "data:image/png;base64,$(printf 'not an image' | base64 -w0)" "not an image" "unsupported format"
bad_url "data:image/png;base64,$(head -c 60 "$T/media/a.png" | base64 -w0)" "truncated PNG" "corrupt PNG"
bad_url "data:text/plain,hello" "not an image data URL" "expected a data:image"
bad_url "$T/outside.png" "path outside the media folder" "outside --allowed-media-dir"
bad_url "$T/media/../outside.png" "path escaping with .." "outside --allowed-media-dir"
bad_url "$T/media/none.png" "missing file" "does not exist"
s=$(post /v1/chat/completions '{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"uri":"x"}}]}]}')
[ "$s" = 400 ] && [ "$(jq -r .error.param "$T/body")" = "$P" ] && ok "400 image_url without url" || fail "no url: HTTP $s $(cat "$T/body")"
[ "$(curl -s -m 10 "$URL/health" | jq -r .status)" = ok ] && ok "healthy after the refusals" || fail "health"
stop_server "$MAIN"
# no --allowed-media-dir: local paths refused
start_server nodir -m "$M" -t 1
s=$(curl -s -m 60 -o "$T/body" -w '%{http_code}' "$URL/v1/chat/completions" --data-binary @"$T/req_p.json")
[ "$s" = 400 ] && jq -r .error.message "$T/body" | grep -q -- "--allowed-media-dir" && ok "local path without --allowed-media-dir: 400" ||
    fail "no media dir: HTTP $s $(cat "$T/body")"
stop_server "$SPID"
# a checkpoint written without its tower: image parts get a 400 saying so; text still works
"$EPYQ" synth -o "$T/notower" --shape tiny --format ct --no-vision -t 1 >"$T/synth.log" 2>&1 || { cat "$T/synth.log"; exit 1; }
start_server notower -m "$T/notower" -t 1
s=$(curl -s -m 60 -o "$T/body" -w '%{http_code}' "$URL/v1/chat/completions" --data-binary @"$T/req.json")
[ "$s" = 400 ] && [ "$(jq -r .error.param "$T/body")" = "$P" ] && jq -r .error.message "$T/body" | grep -q "vision tower" &&
    ok "no tower: 400 $(jq -r .error.message "$T/body" | cut -c 1-80)" || fail "no tower: HTTP $s $(cat "$T/body")"
[ "$(post /v1/chat/completions '{"max_tokens":2,"messages":[{"role":"user","content":"Hi"}]}')" = 200 ] && ok "no tower: text requests work" ||
    fail "no tower text: $(cat "$T/body")"
stop_server "$SPID"
finish
