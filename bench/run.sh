#!/usr/bin/env bash
# Side-by-side benchmark of idemproxy against a bare upstream, a plain Go
# reverse proxy and nginx, all on loopback. See BENCHMARKS.md.
#
#   bench/run.sh            full run: closed-loop matrix, fixed rate, memory run
#   bench/run.sh quick      smoke test: short phases, 20k records (about 2 min)
#   bench/run.sh matrix     closed-loop matrix and fixed rate only
#   bench/run.sh memory     memory run only
#   bench/run.sh micro      Go micro-benchmarks of the hot path (-benchmem)
#   bench/run.sh pg         new-key POSTs on PostgreSQL (P: 1 and 3 replicas on one
#                           throwaway cluster, fsync on) next to A, B, B3 (three of
#                           B's processes, load spread as over P's) and E (Badger);
#                           needs the PostgreSQL server binaries (Debian: postgresql)
#   bench/run.sh pg-own-core
#                           the same with the database on a CPU of its own (the
#                           last one), as on a database host, and everything else
#                           (proxies, upstream, load) on the other CPUs (taskset)
#   bench/run.sh container-memory
#                           the image built from this tree in a 256 MiB container,
#                           1,000,000 records stored through its port (needs Docker;
#                           GO_IMAGE/RUNTIME_IMAGE select base images, e.g. the
#                           stand-ins of scripts/local-bases.sh)
#
# Extra arguments after the mode go to idembench (e.g. -rounds 3, -rate 500,
# -idemproxy-env IDEMPROXY_SIGN_SECRET=x). Results: bench/results/<time>/.
set -euo pipefail

cd "$(dirname "$0")/.."
mode="${1:-full}"
runner=()
[ $# -gt 0 ] && shift

export PATH="/usr/local/go/bin:$PATH"
stamp="$(date +%Y%m%d-%H%M%S)"
out="bench/results/$stamp-$mode"
bin="$out/bin"
mkdir -p "$bin"

# nginx (target C) comes from the distribution; install it once if missing.
ensure_nginx() {
	command -v nginx >/dev/null 2>&1 && return 0
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "installing nginx-light (target C)..." >&2
		{ apt-get update -qq && { apt-get install -y -qq nginx-light || apt-get install -y -qq nginx; }; } >&2 ||
			echo "nginx install failed: target C will be skipped" >&2
	else
		echo "nginx not found and cannot install it: target C will be skipped" >&2
	fi
}

micro() {
	# -run '^$': benchmarks only. Each package's benchmarks are short (-benchtime).
	go test -run '^$' -bench . -benchmem -benchtime "${BENCHTIME:-1s}" -count 1 \
		./proxy/ ./idemkey/ ./resign/ ./cache/ | tee "$out/micro.txt"
}

if [ "$mode" = micro ]; then
	micro
	exit 0
fi

if [ "$mode" = container-memory ]; then
	# bench/cmd/containermem runs the container (--network host, loopback only).
	docker build -q ${GO_IMAGE:+--build-arg GO_IMAGE="$GO_IMAGE"} \
		${RUNTIME_IMAGE:+--build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE"} \
		--build-arg VERSION="$(git describe --tags --always 2>/dev/null || echo dev)" -t idemproxy:bench . >/dev/null
	go build -o "$bin/" ./bench/cmd/upstream ./bench/cmd/containermem
	"$bin/containermem" -image idemproxy:bench -upstream-bin "$bin/upstream" -out "$out" "$@" | tee "$out/results.md"
	rm -rf "$bin"
	echo "results: $out/results.md"
	exit 0
fi

case "$mode" in pg | pg-own-core) ;; *) ensure_nginx ;; esac # C is not in the pg modes
go build -o "$bin/idemproxy" .
go build -o "$bin/" ./bench/cmd/upstream ./bench/cmd/plainproxy ./bench/cmd/idembench

case "$mode" in
full) args=(-memory) ;;
matrix) args=() ;;
memory) args=(-throughput=false -rate 0 -memory) ;;
pg) args=(-targets ABEP) ;;
pg-own-core)
	cpus=$(nproc)
	if [ "$cpus" -lt 2 ] || ! command -v taskset >/dev/null; then
		echo "pg-own-core needs 2 CPUs or more and taskset (util-linux)" >&2
		exit 2
	fi
	args=(-targets ABEP -pg-cpus $((cpus - 1)))
	runner=(taskset -c 0-$((cpus - 2)))
	;;
quick) args=(-rounds 1 -warmup 500ms -duration 2s -rate-duration 2s -settle 200ms -replay-keys 2000
	-memory -records 20000 -mem-ttl 30s -mem-gc-interval 0) ;;
*)
	echo "unknown mode $mode (full, quick, matrix, memory, micro, pg, pg-own-core, container-memory)" >&2
	exit 2
	;;
esac

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"${runner[@]}" "$bin/idembench" -bin "$bin" -out "$out" -nginx "$(command -v nginx || true)" "${args[@]}" "$@"
rm -rf "$bin"
echo "results: $out/results.md"
