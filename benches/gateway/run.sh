#!/usr/bin/env bash
# The gateway benchmark (docs/PERFORMANCE.md, "The gateway"): on this machine, in one run, the
# mock provider alone (the reference), a bare hyper pass-through (the floor; and again on one
# thread a core, as the gateway serves, its ratio to the floor shown), stormguard-gateway
# started from the environment alone, and LiteLLM's proxy (one worker, a master key) when it can
# be installed; each in front of the same mock, on 127.0.0.1, loaded by gateway-load on the same
# machine. Prints one markdown table (also written to $TARGET/gateway-bench/table.md).
#
#   benches/gateway/run.sh                     about 3 minutes with the defaults
#   BENCH_SECONDS=10 benches/gateway/run.sh    longer runs, steadier figures
#
# Settings (environment): BENCH_SECONDS (5: each measured run), BENCH_WARMUP_SECONDS (2),
# BENCH_CONNECTIONS (64), BENCH_RATES (200,1000,5000), BENCH_STREAM_RATE (50 streams/s),
# MOCK_CHUNKS (16) and MOCK_CHUNK_GAP_MS (2) for the mock's streams, BENCH_LITELLM (1; 0 skips
# LiteLLM), BENCH_SETTLE_SECONDS (1: the wait after a start before idle memory is read).
# LiteLLM is installed once into its own venv, $TARGET/gateway-bench/litellm-venv
# (`pip install 'litellm[proxy]'`); when that fails the table says so and goes on without it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET/release
OUT=$TARGET/gateway-bench
VENV=$OUT/litellm-venv
SETTLE=${BENCH_SETTLE_SECONDS:-1}
export BENCH_RESULTS=$OUT/results.txt
mkdir -p "$OUT"
load_before=$(cut -d" " -f1-3 /proc/loadavg)
: >"$BENCH_RESULTS"

started=()
measuring=
cleanup() {
    if [ -n "$measuring" ]; then kill -TERM "$measuring" 2>/dev/null || true; fi
    for pid in "${started[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    sleep 0.3
    for pid in "${started[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# start NAME PORT COMMAND...: starts COMMAND in a process group of its own, waits until PORT
# answers; sets PID and START_MS (from the spawn until the first HTTP answer).
start() {
    local name=$1 port=$2
    shift 2
    local since=$EPOCHREALTIME
    setsid "$@" >"$OUT/$name.log" 2>&1 &
    PID=$!
    started+=("$PID")
    if ! START_MS=$("$BIN/gateway-load" wait "$port" "$since" "$PID"); then
        echo "$name did not start; its log:" >&2
        tail -20 "$OUT/$name.log" >&2
        stop "$PID"
        return 1
    fi
    sleep "$SETTLE"
}

# measure PORT NAME FIELDS...: gateway-load's measurement of one subject, in the background so
# that a signal reaches the trap at once (bash runs traps only between commands it waits for).
measure() {
    "$load" measure "$@" >/dev/null &
    measuring=$!
    wait "$measuring"
    measuring=
}

# stop PID: ends the subject's process group, and waits for it.
stop() {
    kill -TERM -- "-$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    local left=() pid
    for pid in "${started[@]}"; do [ "$pid" = "$1" ] || left+=("$pid"); done
    started=("${left[@]}")
}

# size FILE: its size in bytes once stripped of debug info (what would ship).
size() {
    if command -v strip >/dev/null; then
        strip -o "$OUT/stripped" "$1" && stat -c %s "$OUT/stripped" && rm -f "$OUT/stripped"
    else
        stat -c %s "$1"
    fi
}

echo "building (release)..." >&2
(cd "$ROOT" && cargo build --release --quiet -p stormguard-benches --bins -p stormguard-gateway)
load=$BIN/gateway-load
notes=()

mock_port=$("$load" port)
start mock "$mock_port" "$BIN/gateway-mock" "$mock_port"
mock_pid=$PID
measure "$mock_port" "mock provider" pid="$mock_pid" reference=1 \
    start_ms="$START_MS" size_bytes="$(size "$BIN/gateway-mock")"

port=$("$load" port)
start proxy "$port" "$BIN/gateway-proxy" "$port" "127.0.0.1:$mock_port"
measure "$port" "bare hyper proxy" pid="$PID" floor=1 \
    start_ms="$START_MS" size_bytes="$(size "$BIN/gateway-proxy")"
stop "$PID"

# The floor again, served as the gateway serves (one thread a core): what that is worth alone.
port=$("$load" port)
start proxy-per-core "$port" "$BIN/gateway-proxy" "$port" "127.0.0.1:$mock_port" per-core
measure "$port" "bare hyper proxy, per-core threads" pid="$PID" \
    start_ms="$START_MS" size_bytes="$(size "$BIN/gateway-proxy")"
stop "$PID"

port=$("$load" port)
start gateway "$port" env -u OPENAI_API_KEY -u ANTHROPIC_API_KEY -u STORMGUARD_UPSTREAM_KEY \
    STORMGUARD_UPSTREAM_URL="http://127.0.0.1:$mock_port" \
    "$BIN/stormguard-gateway" --listen "127.0.0.1:$port"
measure "$port" "stormguard-gateway" pid="$PID" \
    start_ms="$START_MS" size_bytes="$(size "$BIN/stormguard-gateway")"
stop "$PID"

if [ "${BENCH_LITELLM:-1}" != 0 ]; then
    if [ ! -x "$VENV/bin/litellm" ]; then
        echo "installing LiteLLM into $VENV..." >&2
        { python3 -m venv "$VENV" && "$VENV/bin/pip" install --quiet 'litellm[proxy]'; } \
            >"$OUT/litellm-install.log" 2>&1 || true
    fi
    if [ -x "$VENV/bin/litellm" ]; then
        version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))')
        cat >"$OUT/litellm.yaml" <<YAML
model_list:
  - model_name: bench-model
    litellm_params:
      model: openai/bench-model
      api_base: http://127.0.0.1:$mock_port/v1
      api_key: sk-bench-provider
YAML
        master=sk-bench-master
        port=$("$load" port)
        # The model cost map is read from the package, not fetched: the benchmark stays offline.
        if start litellm "$port" env LITELLM_MASTER_KEY="$master" LITELLM_LOCAL_MODEL_COST_MAP=True \
            "$VENV/bin/litellm" --config "$OUT/litellm.yaml" --host 127.0.0.1 --port "$port" \
            --num_workers 1; then
            measure "$port" "LiteLLM proxy $version" pid="$PID" key="$master" \
                start_ms="$START_MS" size_bytes="$(du -sb "$VENV" | cut -f1)"
            stop "$PID"
            notes+=("LiteLLM's size is its venv's (Python and every package it installs).")
        else
            notes+=("LiteLLM $version did not start (see $OUT/litellm.log): not measured.")
        fi
    else
        notes+=("LiteLLM could not be installed (see $OUT/litellm-install.log): not measured.")
    fi
fi

{
    "$load" table "$BENCH_RESULTS"
    echo
    echo "Latencies: the mock's own, then what each subject adds to them at the same rate (ms);"
    echo "a rate above a subject's saturation is not offered (-). Sizes stripped of debug info."
    for note in "${notes[@]}"; do echo "$note"; done
    echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs);" \
        "load average before: $load_before; after: $(cut -d' ' -f1-3 /proc/loadavg)."
} | tee "$OUT/table.md"
