#!/usr/bin/env bash
# hit.sh measures cache hits of herd proxy, nginx proxy_cache and Varnish,
# each in front of the same loopback origin, with wrk: the same
# connections, threads, duration and URL for each, runs interleaved.
#
#   bench/http/hit.sh [ROUNDS] [DURATION] [CONNECTIONS] [THREADS]
#
# Defaults: 5 rounds of 5s, 64 connections, 2 threads. It installs nginx,
# varnish and wrk from Debian when missing (apt-get), and stops every
# process it started on exit.
set -euo pipefail
ROUNDS=${1:-5} DUR=${2:-5s} CONNS=${3:-64} THREADS=${4:-2}
SIZE=${SIZE:-1024}
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/herd-hit.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	[ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true
	sleep 0.5
	[ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v varnishd >/dev/null || [ -x /usr/sbin/varnishd ] || need+=(varnish)
command -v wrk >/dev/null || need+=(wrk)
if [ ${#need[@]} -gt 0 ]; then
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
export PATH=$PATH:/usr/sbin

# cputicks PID: the user and system CPU time, in clock ticks, used so far
# by PID and every process under it (nginx's workers, Varnish's child),
# from /proc/PID/stat fields 14 and 15.
descendants() {
	echo "$1"
	for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do descendants "$c"; done
}
cputicks() {
	local t=0 p f
	for p in $(descendants "$1"); do
		f=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null) || continue
		set -- $f # fields from the 3rd on: utime is the 12th, stime the 13th
		t=$((t + ${12} + ${13}))
	done
	echo "$t"
}
hz=$(getconf CLK_TCK)

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

(cd "$repo/bench" && go build -o "$work/origin" ./http/origin)
(cd "$repo/cmd/herd" && go build -o "$work/herd" .)

# The origin.
"$work/origin" -listen 127.0.0.1:0 -addr-file "$work/origin.addr" -size "$SIZE" &
pids+=($!)
for _ in $(seq 50); do [ -s "$work/origin.addr" ] && break; sleep 0.1; done
origin=$(cat "$work/origin.addr")

# herd proxy: memory mode, access log off (the default).
hp=$(freeport)
"$work/herd" proxy --upstream "http://$origin" --listen "127.0.0.1:$hp" >"$work/herd.log" 2>&1 &
pids+=($!)
herdpid=$!

# nginx: worker_processes auto, access log off, keep-alive unbounded like
# the others, cache on tmpfs-backed /tmp or disk, keys zone in memory.
np=$(freeport)
mkdir -p "$work/nginx/cache" "$work/nginx/tmp"
chmod 755 "$work"; chmod -R 777 "$work/nginx" # the workers run as another user
cat >"$work/nginx.conf" <<CONF
worker_processes auto;
pid $work/nginx.pid;
error_log $work/nginx/error.log warn;
daemon off;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path $work/nginx/tmp;
	proxy_temp_path $work/nginx/tmp;
	fastcgi_temp_path $work/nginx/tmp;
	uwsgi_temp_path $work/nginx/tmp;
	scgi_temp_path $work/nginx/tmp;
	keepalive_requests 100000000;
	keepalive_timeout 75s;
	proxy_cache_path $work/nginx/cache keys_zone=hit:10m max_size=64m;
	upstream origin { server $origin; keepalive 64; }
	server {
		listen 127.0.0.1:$np;
		location / {
			proxy_pass http://origin;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_cache hit;
			add_header Cache-Status \$upstream_cache_status;
		}
	}
}
CONF
nginx -c "$work/nginx.conf" -e "$work/nginx/error.log" &
pids+=($!)
nginxpid=$!

# Varnish: default thread pools, 64 MiB malloc storage, no varnishncsa.
vp=$(freeport)
varnishd -F -n "$work/varnish" -a "127.0.0.1:$vp" -b "$origin" -s malloc,64m \
	-T none >"$work/varnish.log" 2>&1 &
pids+=($!)
varnishpid=$!

url=/page
ready() { curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1$url" 2>/dev/null | grep -q 200; }
for p in $hp $np $vp; do
	for _ in $(seq 100); do ready "$p" && break; sleep 0.1; done
	ready "$p" || { echo "port $p does not answer" >&2; cat "$work"/*.log >&2; exit 1; }
	# warm: the second and third requests are hits
	curl -s -o /dev/null "http://127.0.0.1:$p$url"; curl -s -D - -o /dev/null "http://127.0.0.1:$p$url" | grep -iE '^(cache-status|age|x-varnish):' | tr -d '\r' | sed "s/^/  127.0.0.1:$p /"
done

declare -A port=([herd]=$hp [nginx]=$np [varnish]=$vp)
declare -A pid=([herd]=$herdpid [nginx]=$nginxpid [varnish]=$varnishpid)
names=(herd nginx varnish)
echo "wrk -t$THREADS -c$CONNS -d$DUR --latency, $ROUNDS rounds interleaved, body $SIZE bytes"
for r in $(seq "$ROUNDS"); do
	# rotate the order so that no server always runs first
	for i in 0 1 2; do
		n=${names[$(( (i + r) % 3 ))]}
		t0=$(cputicks "${pid[$n]}")
		out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DUR" --latency "http://127.0.0.1:${port[$n]}$url")
		t1=$(cputicks "${pid[$n]}")
		reqs=$(awk '/requests in/ {print $1}' <<<"$out")
		# the server's CPU time per request, in microseconds
		cpu=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$reqs" 'BEGIN { printf "%.1f", (n > 0 ? d / hz / n * 1e6 : 0) }')
		rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
		p50=$(awk '$1=="50%" {print $2}' <<<"$out")
		p99=$(awk '$1=="99%" {print $2}' <<<"$out")
		non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
		printf '%s round %d %-8s %10s req/s  p50 %8s  p99 %8s  CPU %6s us/req  %s\n' "$(date -u +%T)" "$r" "$n" "$rps" "$p50" "$p99" "$cpu" "${non2xx:+non-2xx $non2xx}"
		echo "$n $rps $p50 $p99 $cpu" >>"$work/results"
	done
done
echo "herd proxy RSS: $(awk '/VmHWM/ {print $2, $3}' /proc/$herdpid/status) peak"
python3 - "$work/results" <<'PY'
import sys, statistics
def ms(v):
    for u, f in (("us", 1e-3), ("ms", 1), ("s", 1e3)):
        if v.endswith(u) and not (u == "s" and v.endswith(("us", "ms"))):
            return float(v[:-len(u)]) * f
rows = {}
for line in open(sys.argv[1]):
    n, rps, p50, p99, cpu = line.split()
    rows.setdefault(n, []).append((float(rps), ms(p50), ms(p99), float(cpu)))
med = {}
print("%-8s %12s %10s %10s %14s" % ("server", "req/s med", "p50 ms", "p99 ms", "CPU us/req"))
for n, v in rows.items():
    med[n] = statistics.median(r[0] for r in v)
    print("%-8s %12.0f %10.3f %10.3f %14.1f" % (n, med[n], statistics.median(r[1] for r in v), statistics.median(r[2] for r in v), statistics.median(r[3] for r in v)))
print("herd / nginx   %.2f" % (med["herd"] / med["nginx"]))
print("herd / varnish %.2f" % (med["herd"] / med["varnish"]))
PY
