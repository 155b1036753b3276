#!/bin/sh
# `epyq serve` driven by the official `openai` npm client (tests/e2e/serve_openai.mjs): models,
# chat non-streaming = streaming at temperature 0 and a fixed seed, completions, 16 concurrent
# streams, an aborted stream (cancelled server-side) then healthy requests, refused fields as
# BadRequestError naming the param, a wrong key, SIGTERM during a stream (it completes, the
# server exits 0). The package is installed with npm into the build tree (not vendored); no
# node, no npm or no registry = SKIP (77), never a pass.
. "${srcdir:-.}/tests/e2e/tools_lib.sh"
. "${srcdir:-.}/tests/e2e/serve_lib.sh"
"$EPYQ" serve --help >/dev/null 2>&1 || { echo "epyq serve is not built (no libmicrohttpd)"; exit 77; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "SKIP: no node/npm"; exit 77; }
major=$(node -e 'console.log(process.versions.node.split(".")[0])')
[ "$major" -ge 18 ] || { echo "SKIP: node $major is older than the openai client needs (18)"; exit 77; }
NODE_DIR="${EPYQ_BUILDDIR:-$PWD}/tests/e2e/node"
if ! [ -f "$NODE_DIR/node_modules/openai/package.json" ]; then
    mkdir -p "$NODE_DIR"
    [ -f "$NODE_DIR/package.json" ] || echo '{"private":true}' >"$NODE_DIR/package.json"
    if ! (cd "$NODE_DIR" && timeout 180 npm install --no-audit --no-fund --loglevel=error openai@^7 >"$T/npm.log" 2>&1); then
        echo "SKIP: npm install openai failed:"; tail -5 "$T/npm.log"; exit 77
    fi
fi
echo "openai $(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$NODE_DIR/node_modules/openai/package.json" | head -1), node $(node --version)"
make_model
# the aborted stream asks for 60000 tokens: it cannot finish before its client goes
make_long_model
start_server main -m "$T/long" --served-model-name tiny -t 1 -c 65536 --parallel 4 --api-key sekret --grace 20
cp "${srcdir:-.}/tests/e2e/serve_openai.mjs" "$NODE_DIR/serve_openai.mjs"
EPYQ_URL=$URL EPYQ_MODEL=tiny EPYQ_PID=$SPID timeout 300 node "$NODE_DIR/serve_openai.mjs" || fail "openai client session"
stop_server $SPID
[ "$RC" = 0 ] && ok "server exit status 0 after SIGTERM" || fail "server exit: $RC"
finish
