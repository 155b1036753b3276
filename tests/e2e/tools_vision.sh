#!/bin/sh
# Image input through the tools (docs/vision.md): `epyq run --image` on a tiny synthetic
# checkpoint (its tower is BF16, its template writes the image placeholders) with one and two
# images, deterministic under a seed; bad images refused with one line naming the file; and,
# when ../shared is present, `epyq logits --image` on the tiny-vision fixture gives its greedy ids.
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
make_model
# A 40 x 24 RGB PNG written by hand (zlib from python3, which scripts/setup installs).
python3 - "$T" <<'PY' || { echo "python3 could not write the test PNG"; exit 1; }
import struct, sys, zlib
def png(path, w, h, seed):
    rows = b"".join(b"\0" + bytes(((x * 7 + y * 5 + c * 60 + seed) & 255) for x in range(w) for c in range(3)) for y in range(h))
    def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                           chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
png(sys.argv[1] + "/a.png", 40, 24, 0)
png(sys.argv[1] + "/b.png", 24, 64, 99)
PY
R="run -m $M -t 1 -n 6 -s 7 --chat --no-think"
expect 0 "run --image" "$EPYQ" $R --image "$T/a.png" -p "What is this?"
cp "$T/out" "$T/img1"
grep -q '^\[ 1 images: 77 image tokens, encoded in' "$T/err" || fail "run --image: no image line (40x24 -> 352x224 -> 77 tokens)"
expect 0 "run --image again, same seed" "$EPYQ" $R --image "$T/a.png" -p "What is this?"
cmp -s "$T/out" "$T/img1" || fail "run --image: same seed gave different text"
expect 0 "run with two images" "$EPYQ" $R --image "$T/a.png" --image "$T/b.png" -p "Compare them."
grep -q '^\[ 2 images: ' "$T/err" || fail "two images: no image line"
expect 0 "run raw prompt with a placeholder" "$EPYQ" run -m "$M" -t 1 -n 4 --image "$T/a.png" \
    -p "x <|vision_start|><|image_pad|><|vision_end|> y"
# refusals: one line naming the file, exit status 1
printf 'not an image' >"$T/bad.png"
head -c 60 "$T/a.png" >"$T/cut.png"
expect 1 "run --image (not an image)" "$EPYQ" $R --image "$T/bad.png" -p x
grep -qx "epyq: $T/bad.png: unsupported format (not an image): expected a PNG or JPEG image" "$T/err" ||
    fail "not an image: message was: $(cat "$T/err")"
expect 1 "run --image (truncated PNG)" "$EPYQ" $R --image "$T/cut.png" -p x
grep -q "^epyq: $T/cut.png: corrupt PNG" "$T/err" || fail "truncated PNG: message was: $(cat "$T/err")"
expect 1 "run --image (missing file)" "$EPYQ" $R --image "$T/none.png" -p x
grep -q "$T/none.png" "$T/err" || fail "missing image: message does not name the file"
expect 1 "run --image without a placeholder" "$EPYQ" run -m "$M" -t 1 -n 4 --image "$T/a.png" -p "plain text"
grep -q "0 <|image_pad|> tokens for 1 images" "$T/err" || fail "no placeholder: message was: $(cat "$T/err")"
expect 1 "run --image --spec mtp" "$EPYQ" $R --image "$T/a.png" --spec mtp -p x
# the fixture: prompt ids with the image's 6 pads, greedy ids of greedy.json
F=${EPYQ_SHARED:-}/fixtures/models/tiny-vision
if [ -n "${EPYQ_SHARED:-}" ] && [ -d "$F" ]; then
    ids=$(jq -r '.input_ids | map(tostring) | join(",")' "$F/expected/mrope.json")
    greedy=$(jq -c '.ids' "$F/expected/greedy.json")
    for p in a16 a8; do
        expect 0 "logits --image --path $p" "$EPYQ" logits -m "$F" --ids "$ids" --image "$F/expected/image.png" -n 7 --path $p -t 2
        got=$(jq -c '.argmax[16:]' "$T/out")
        [ "$got" = "$greedy" ] && ok "logits --image $p: greedy ids $got" || fail "logits --image $p: greedy $got, expected $greedy"
    done
else
    echo "skip: ../shared not present (logits --image on the fixture)"
fi
finish
