#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# bench-paths.sh KVXBENCH [ROUNDS]: issue "fast on every path" in one run. Each round runs, in
# turn, the 4096-token Llama-3-8B request (concurrency 1) on every path and its limit, so each
# ratio compares figures taken minutes apart under the same load:
#   shm rma, default lanes / --lanes 1            (lanes vs one lane)
#   shm rma / ucx_perftest -t ucp_get at 64 MiB   (RMA vs ucp_get)
#   tcp, the engine's choice / tag_bw over TCP    (kvxbench's own baseline, same message size)
#   tcp --rma-where-emulated / tag_bw             (what the choice avoided)
#   tcp / tag_bw -e with UCX_RNDV_SCHEME=get_zcopy (UCX as kvxfer sets it up: peer error
#                                                  handling and the receiver-pulled rendezvous;
#                                                  kvxbench's baseline runs with neither)
#   shm --staging / tag_bw; --staging with TP=2->1 and with block-major -> layer-major / tag_bw
#   shm TP=2->1 and block-major -> layer-major on the engine's own choice (the direct path's
#   IOV messages) / tag_bw
# and prints every figure with the load average beside it, then the ratios by round.
set -eu
KVXBENCH=${1:?usage: bench-paths.sh KVXBENCH [ROUNDS]}
ROUNDS=${2:-3}
DUR=${BENCH_PATHS_DURATION:-3s}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }

run() { # name flags...
	name=$1
	shift
	l=$(load)
	"$KVXBENCH" run --json --prompts 4k --concurrency 1 --duration "$DUR" "$@" >"$out/$name.json"
	python3 - "$name" "$l" "$out/$name.json" <<'PY' | tee -a "$out/rows"
import json, sys
name, load, path = sys.argv[1:4]
d = json.loads(open(path).read().splitlines()[-1])
print(f'{name} path={d.get("path")} gbps={d["gbps"]:.3f} baseline_gbps={d.get("baseline_gbps", 0):.3f} '
      f'ratio={d.get("ratio", 0):.3f} load={load}')
PY
}

perftest() { # name test tls flags [VAR=value...]: ucx_perftest of 64 MiB messages on loopback
	name=$1 test=$2 tls=$3 flags=$4
	shift 4
	l=$(load)
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	args="-t $test -s 67108864 -n 40 -w 4 -p $port -f -v $flags"
	env UCX_TLS="$tls" "$@" timeout 120 ucx_perftest $args >/dev/null 2>&1 &
	srv=$!
	sleep 1
	env UCX_TLS="$tls" "$@" timeout 120 ucx_perftest 127.0.0.1 $args >"$out/$name.txt" 2>&1 || true
	wait $srv || true
	python3 - "$name" "$l" "$out/$name.txt" "$test $flags $*" <<'PY' | tee -a "$out/rows"
import sys
name, load, path, what = sys.argv[1:5]
lines = [l.strip() for l in open(path)]
gbps = 0.0
for i, l in enumerate(lines):
    if l.startswith("iterations,"):
        h = l.split(",")
        v = lines[i + 1].split(",")
        gbps = float(dict(zip(h, v))["overall_bw"]) * (1 << 20) / 1e9
print(f'{name} perftest={what.strip().replace(" ", "+")} gbps={gbps:.3f} load={load}')
PY
}

i=1
while [ "$i" -le "$ROUNDS" ]; do
	run "r$i.shm.lanes" --tls posix,cma,self
	run "r$i.shm.lane1" --tls posix,cma,self --lanes 1
	perftest "r$i.shm.ucp_get" ucp_get posix,cma,self ""
	run "r$i.tcp.choice" --tls tcp,self
	perftest "r$i.tcp.tag_bw_kvx" tag_bw tcp,self -e UCX_RNDV_SCHEME=get_zcopy
	run "r$i.tcp.rma" --tls tcp,self --rma-where-emulated
	run "r$i.shm.staging" --tls posix,cma,self --staging
	run "r$i.shm.staging.tp2" --tls posix,cma,self --staging --prefill-tp 2
	run "r$i.shm.staging.conv" --tls posix,cma,self --staging --decode-order layer-major
	run "r$i.shm.tp2" --tls posix,cma,self --prefill-tp 2
	run "r$i.shm.conv" --tls posix,cma,self --decode-order layer-major
	i=$((i + 1))
done

python3 - "$out/rows" <<'PY'
import sys, re
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    rows[f[0]] = {k: v for k, v in (x.split("=", 1) for x in f[1:] if "=" in x)}
rounds = sorted({k.split(".")[0] for k in rows})
g = lambda r, n, k="gbps": float(rows[f"{r}.{n}"][k])
print()
print("round  lanes/1-lane  rma/ucp_get  tcp-choice/tag_bw  tcp-choice/tag_bw(-e,get_zcopy)  tcp-rma/tag_bw  staging/tag_bw  staging-tp2/tag_bw  staging-conv/tag_bw  tp2/tag_bw  conv/tag_bw")
for r in rounds:
    print(f'{r:6} {g(r,"shm.lanes")/g(r,"shm.lane1"):12.2f} {g(r,"shm.lanes")/max(g(r,"shm.ucp_get"),1e-9):12.2f} '
          f'{g(r,"tcp.choice","ratio"):18.2f} {g(r,"tcp.choice")/max(g(r,"tcp.tag_bw_kvx"),1e-9):29.2f} {g(r,"tcp.rma","ratio"):15.2f} {g(r,"shm.staging","ratio"):15.2f} '
          f'{g(r,"shm.staging.tp2","ratio"):19.2f} {g(r,"shm.staging.conv","ratio"):20.2f} {g(r,"shm.tp2","ratio"):11.2f} '
          f'{g(r,"shm.conv","ratio"):12.2f}')
PY
