# tests/e2e/serve_lib.sh — sourced after tools_lib.sh by the serve tests: start `epyq serve`
# on 127.0.0.1 at a free port (--port 0; the port is read from its "listening" line), stop it,
# and always kill what was started when the test exits.
SERVERS=""
trap 'for p in $SERVERS; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$T"' EXIT

# start_server NAME ARGS...: sets SPID and URL; the server's stderr goes to $T/NAME.err.
start_server() {
    name=$1; shift
    "$EPYQ" serve --port 0 "$@" 2>"$T/$name.err" &
    SPID=$!
    SERVERS="$SERVERS $SPID"
    i=0
    while ! grep -q '"event":"listening"' "$T/$name.err" 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt 600 ] || ! kill -0 "$SPID" 2>/dev/null; then
            echo "server $name did not start:"; cat "$T/$name.err"; exit 1
        fi
        sleep 0.05
    done
    port=$(grep '"event":"listening"' "$T/$name.err" | jq -r .port)
    URL="http://127.0.0.1:$port"
}

# stop_server PID: SIGTERM, wait at most 30 s, exit status in RC ("hung" if it had to be
# killed). Not in a subshell: only the parent shell can reap it.
stop_server() {
    kill -TERM "$1" 2>/dev/null
    ( sleep 30; kill -KILL "$1" 2>/dev/null ) >/dev/null 2>&1 &
    watchdog=$!
    wait "$1"; RC=$?
    kill "$watchdog" 2>/dev/null
    [ $RC = 137 ] && RC=hung
}

# post PATH JSON [curl args...]: body to $T/body, HTTP status to stdout.
post() {
    path=$1 data=$2; shift 2
    curl -s -m 60 -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' "$@" --data-binary "$data" "$URL$path"
}
