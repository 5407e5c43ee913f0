#!/usr/bin/env bash
# The official Python SDKs (`openai`, `anthropic`) read whole answers through the stormguard-gateway
# binary, from providers that fail on purpose: installs the SDKs in a virtual environment of its
# own, builds the gateway and starts `stormguard-gateway demo` on a free loopback port (it starts
# its mock providers itself: a flaky one that fails whole requests and cuts streams on a fixed
# schedule, and a backup), runs stream_check.py against it, and stops everything when it ends,
# whatever its result. Arguments are passed on to stream_check.py (`--requests N`, `--whole N`).
#
# Exit status: the check's. When the SDKs cannot be installed (no network), it says
# "SDK check skipped" and exits 0: the check cannot run, and that is no fault of the code.
set -euo pipefail
cd "$(dirname "$0")/../.."

work=$(mktemp -d)
gateway_pid=""
stop_gateway() {
    if [ -n "$gateway_pid" ]; then
        kill "$gateway_pid" 2>/dev/null || true
        wait "$gateway_pid" 2>/dev/null || true
    fi
    gateway_pid=""
}
cleanup() {
    stop_gateway
    rm -rf "$work"
}
trap cleanup EXIT

echo "== SDKs: pip install openai anthropic"
if ! python3 -m venv "$work/venv" >"$work/venv.log" 2>&1; then
    echo "SDK check skipped: python3 could not create a virtual environment"
    tail -n 3 "$work/venv.log"
    exit 0
fi
# Few retries and a short timeout: without a network this gives up in seconds, not minutes.
if ! "$work/venv/bin/pip" install -q --disable-pip-version-check --retries 1 --timeout 20 \
    openai anthropic >"$work/pip.log" 2>&1; then
    echo "SDK check skipped: the SDKs did not install"
    tail -n 3 "$work/pip.log"
    exit 0
fi

echo "== gateway: stormguard-gateway demo --listen"
cargo build -q -p stormguard-gateway
target_dir=$(cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
gateway="$target_dir/debug/stormguard-gateway"
log="$work/gateway.log"
for _ in $(seq 1 20); do
    port=$(( 20000 + RANDOM % 40000 ))
    # Taken already: try another.
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then continue; fi
    "$gateway" demo --listen "127.0.0.1:$port" >"$log" 2>&1 &
    gateway_pid=$!
    # It says where it listens once it is bound; if it exits first, the port was taken since.
    for _ in $(seq 1 100); do
        if grep -q "listens on" "$log"; then break 2; fi
        if ! kill -0 "$gateway_pid" 2>/dev/null; then break; fi
        sleep 0.1
    done
    stop_gateway
done
if [ -z "$gateway_pid" ]; then
    echo "could not start the gateway on a loopback port" >&2
    cat "$log" >&2
    exit 1
fi
cat "$log"

echo "== stream_check.py"
"$work/venv/bin/python" examples/sdk/stream_check.py "http://127.0.0.1:$port" "$@"
