#!/usr/bin/env bash
# flood.sh floods herd proxy with distinct cache misses at a fixed rate
# (open loop) in front of a slow loopback origin, and reports latency,
# answers by status, the proxy's peak RSS and the origin's peak
# concurrency.
#
#   bench/http/flood.sh [RATE] [DURATION] [-- herd proxy flags]
#
# Defaults: 2000/s for 10s, origin delay 300ms (DELAY), bodies 16 KiB
# (SIZE); herd proxy runs with its default bounds unless flags are given.
# IDLE=N first opens N connections that make one request each and stay
# open, idle, through the flood.
set -euo pipefail
RATE=${1:-2000} DUR=${2:-10s}
shift $(( $# < 2 ? $# : 2 )); [ "${1:-}" = "--" ] && shift
DELAY=${DELAY:-300ms} SIZE=${SIZE:-16384} IDLE=${IDLE:-0}
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/herd-flood.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

(cd "$repo/bench" && go build -o "$work/origin" ./http/origin && go build -o "$work/flood" ./http/flood)
(cd "$repo/cmd/herd" && go build -o "$work/herd" .)
"$work/origin" -listen 127.0.0.1:0 -addr-file "$work/origin.addr" -size "$SIZE" -delay "$DELAY" &
pids+=($!)
for _ in $(seq 50); do [ -s "$work/origin.addr" ] && break; sleep 0.1; done
origin=$(cat "$work/origin.addr")
hp=$(freeport)
"$work/herd" proxy --upstream "http://$origin" --listen "127.0.0.1:$hp" "$@" >"$work/herd.log" 2>&1 &
pids+=($!)
herdpid=$!
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$hp/_stats" && break; sleep 0.1; done
echo "herd proxy $* ; origin delay $DELAY, body $SIZE bytes; $RATE/s for $DUR; $IDLE idle connections"
echo "proxy RSS before: $(awk '/VmRSS/ {print $2, $3}' /proc/$herdpid/status)"
"$work/flood" -url "http://127.0.0.1:$hp" -rate "$RATE" -duration "$DUR" -pid "$herdpid" -idle "$IDLE"
echo "origin: $(curl -s "http://$origin/_stats") (requests served, most at once)"
