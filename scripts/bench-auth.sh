#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# bench-auth.sh KVXBENCH [ROUNDS]: what a cluster key costs, per path, in one run. Each round
# runs the 4096-token Llama-3-8B request (concurrency 1) on every path twice in a row, without
# and with --cluster-key (a fresh random key; hellos sealed, each request's claim proven), the
# order swapped every other round so a drift in the host's load favours neither. It prints
# every figure with the load average beside it, then keyed GB/s over unkeyed GB/s per path and
# round, and the median over rounds:
#   rma        shared memory, the engine's choice (RMA gets from a pool UCX mapped)
#   direct     --no-rma (tagged IOV messages between the pools)
#   cma        --pool caller (RMA gets from a registered pool: process_vm_readv, after the proof)
#   pull       --staging (the pull wire, chunks scattered in place from the prefill slots)
#   pull-get   --staging --no-in-place (the pull wire, each chunk read with a get first)
#   staging    --staging --no-pull (tagged data messages through slots)
#   tcp        --tls tcp,self (the engine's choice over TCP)
#   device     --memory device (only where `kvxbench devices` finds a GPU)
# BENCH_AUTH_ONLY=WORD runs only the paths whose name contains WORD; BENCH_AUTH_DURATION sets
# each run's --duration (default 3s). No baseline runs: the ratio compares the engine with
# itself, so ucx_perftest would only add noise and time.
set -eu
KVXBENCH=${1:?usage: bench-auth.sh KVXBENCH [ROUNDS]}
ROUNDS=${2:-3}
DUR=${BENCH_AUTH_DURATION:-3s}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
head -c 32 /dev/urandom >"$out/cluster.key"
chmod 600 "$out/cluster.key"
load() { cut -d' ' -f1 /proc/loadavg; }

device=
if "$KVXBENCH" devices >/dev/null 2>&1; then
	device=yes
fi

run() { # name keyed(0|1) flags...
	name=$1 keyed=$2
	shift 2
	key=
	[ "$keyed" = 1 ] && key="--cluster-key $out/cluster.key"
	l=$(load)
	# shellcheck disable=SC2086 # $key is two words or none
	"$KVXBENCH" run --json --baseline=false --prompts 4k --concurrency 1 --duration "$DUR" $key "$@" >"$out/$name.json"
	python3 - "$name" "$keyed" "$l" "$out/$name.json" <<'PY' | tee -a "$out/rows"
import json, sys
name, keyed, load, path = sys.argv[1:5]
d = json.loads(open(path).read().splitlines()[-1])
assert bool(d.get("cluster_key")) == (keyed == "1"), f"{name}: cluster_key is {d.get('cluster_key')}"
assert d.get("verified"), f"{name}: not verified"
print(f'{name} keyed={keyed} path={d.get("path")} gbps={d["gbps"]:.3f} p50_ms={d["p50_us"] / 1e3:.1f} '
      f'requests={d["requests"]} load={load}')
PY
}

pair() { # round path flags...: unkeyed and keyed, in an order that swaps every round
	r=$1 p=$2
	shift 2
	case "$p" in *"${BENCH_AUTH_ONLY:-}"*) ;; *) return 0 ;; esac
	if [ $((r % 2)) = 1 ]; then
		run "r$r.$p.plain" 0 "$@"
		run "r$r.$p.keyed" 1 "$@"
	else
		run "r$r.$p.keyed" 1 "$@"
		run "r$r.$p.plain" 0 "$@"
	fi
}

i=1
while [ "$i" -le "$ROUNDS" ]; do
	pair "$i" rma --tls posix,cma,self
	pair "$i" direct --tls posix,cma,self --no-rma
	pair "$i" cma --tls posix,cma,self --pool caller
	pair "$i" pull --tls posix,cma,self --staging
	pair "$i" pull-get --tls posix,cma,self --staging --no-in-place
	pair "$i" staging --tls posix,cma,self --staging --no-pull
	pair "$i" tcp --tls tcp,self
	if [ -n "$device" ]; then
		pair "$i" device --memory device
	fi
	i=$((i + 1))
done
[ -n "$device" ] || echo "bench-auth: no GPU (kvxbench devices failed): the device path did not run"

python3 - "$out/rows" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    rows[f[0]] = {k: v for k, v in (x.split("=", 1) for x in f[1:])}
rounds = sorted({k.split(".")[0] for k in rows}, key=lambda r: int(r[1:]))
paths = []
for k in rows:
    p = k.split(".", 1)[1].rsplit(".", 1)[0]
    if p not in paths:
        paths.append(p)
print()
print("keyed GB/s over unkeyed GB/s, per round (the path column names what the engine took)")
print(f'{"path":10} ' + " ".join(f"{r:>6}" for r in rounds) + "  median  engine path")
for p in paths:
    ratios = []
    for r in rounds:
        a, b = rows.get(f"{r}.{p}.plain"), rows.get(f"{r}.{p}.keyed")
        ratios.append(None if a is None or b is None else float(b["gbps"]) / max(float(a["gbps"]), 1e-9))
    got = [x for x in ratios if x is not None]
    med = f"{statistics.median(got):6.3f}" if got else "     -"
    took = rows.get(f"{rounds[0]}.{p}.plain", {}).get("path", "-")
    print(f"{p:10} " + " ".join("     -" if x is None else f"{x:6.3f}" for x in ratios) + f"  {med}  {took}")
PY
