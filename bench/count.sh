#!/usr/bin/env bash
# count.sh counts what one op of a benchmark of this module costs each
# library, under valgrind's cachegrind on one thread: the instructions it
# executes and the data reads and writes that miss a 48 KiB first-level
# cache and a 4 MiB last-level one, simulated, so that the counts are the
# same on any machine and under any load, where a timing moves by a
# fifth from one hour to the next. Each library's benchmark runs twice,
# for few and for many ops; the difference, divided by the ops between
# them, leaves out the process' start and the benchmark's warm-up; the
# garbage collector runs in whole cycles, which 160 ops average out.
#
#   bench/count.sh [benchmark [ops]]   # default: FleetBatch 160
#
# It needs valgrind (Debian: apt-get install valgrind); Go's runtime is
# kept off RDTSCP, which valgrind's x86 emulation lacks. A count is not a
# time: an instruction may take a fraction of a cycle, a last-level miss
# a hundred cycles. It tells, change for change, whether a round does
# less.
set -euo pipefail
cd "$(dirname "$0")"
bench=${1:-FleetBatch}
ops=${2:-160}
(( ops >= 4 )) || { echo "count.sh: ops must be at least 4" >&2; exit 1; }
few=$((ops / 4))
command -v valgrind >/dev/null || { echo "count.sh: valgrind is not installed" >&2; exit 1; }
bin=$(mktemp -d)/bench.test
trap 'rm -rf "$(dirname "$bin")"' EXIT
go test -c -o "$bin" .

# run IMPL N prints the instructions, first-level data misses and
# last-level data misses of N ops of IMPL (and of the start-up).
run() {
	local out
	if ! out=$(GOMAXPROCS=1 GODEBUG=cpu.rdtscp=off valgrind --tool=cachegrind --cache-sim=yes \
		--D1=49152,12,64 --LL=4194304,16,64 --cachegrind-out-file=/dev/null \
		"$bin" -test.run '^$' -test.bench "^Benchmark$bench\$/^impl=$1\$" \
		-test.benchtime "${2}x" -test.cpu 1 2>&1); then
		printf '%s\n' "$out" >&2
		echo "count.sh: $1 failed under valgrind" >&2
		exit 1
	fi
	awk '{ gsub(",", "") }
		/ I +refs:/ { ir = $4 }
		/ D1 +misses:/ { d1 = $4 }
		/ LLd misses:/ { ll = $4 }
		END { print ir, d1, ll }' <<<"$out"
}

impls=$("$bin" -test.run '^$' -test.bench "^Benchmark$bench\$" -test.benchtime 1x -test.cpu 1 |
	sed -n 's/^Benchmark[^/]*\/impl=\([^[:space:]]*\).*/\1/p')
printf '%-16s %14s %14s %14s\n' "$bench" "instructions/op" "D1 misses/op" "LL misses/op"
for impl in $impls; do
	first=$(run "$impl" "$few")
	second=$(run "$impl" "$ops")
	read -r ir1 d11 ll1 <<<"$first"
	read -r ir2 d12 ll2 <<<"$second"
	awk -v n=$((ops - few)) -v i="$impl" -v a="$ir1" -v b="$ir2" -v c="$d11" -v d="$d12" -v e="$ll1" -v f="$ll2" \
		'BEGIN { printf "%-16s %14.0f %14.0f %14.0f\n", i, (b - a) / n, (d - c) / n, (f - e) / n }'
done
