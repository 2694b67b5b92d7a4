#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# bench-paths.sh KVXBENCH [ROUNDS]: issue "fast on every path" in one run. Each round runs, in
# turn, the 4096-token Llama-3-8B request (concurrency 1) on every path and its limit, so each
# ratio compares figures taken minutes apart under the same load:
#   kvxbench memcpy, two threads / one            (what the host gives two copiers now)
#   shm rma, default lanes / --lanes 1            (lanes vs one lane)
#   shm rma / ucx_perftest -t ucp_get at 64 MiB   (RMA vs ucp_get)
#   tcp, the engine's choice / tag_bw over TCP    (kvxbench's own baseline, same message size)
#   tcp --tcp-segment 64KiB / tag_bw              (what engines sent before 1 MiB became the default)
#   tcp --rma-where-emulated / tag_bw             (what the choice avoided)
#   tcp / tag_bw -e with the engine's UCX settings (UCX as kvxfer sets it up on this UCX: peer
#                                                  error handling, and the rendezvous scheme,
#                                                  threshold and TCP settings the round's
#                                                  tcp row reported in env.ucx_settings, e.g.
#                                                  get_zcopy on 1.13, am on 1.22; kvxbench's
#                                                  own baseline runs with none of them)
#   shm --staging / tag_bw (the pull wire), and --staging --no-pull (tagged data messages);
#   --staging with TP=2->1 and with block-major -> layer-major / tag_bw
#   shm TP=2->1 and block-major -> layer-major on the engine's own choice / tag_bw
#   --staging --no-pull again with --shm-fifo 1024 (ucx.Config.ShmFIFOSize, opt-in: every peer
#   must use the same FIFO) / tag_bw as it comes
# and prints every figure with the load average beside it, then the ratios by round.
# BENCH_PATHS_ONLY=WORD runs only the rows whose name contains WORD (e.g. tcp); the ratios of
# rows not run print as "-". BENCH_PATHS_VS=K2 runs each kvxbench row a second time, right
# after the first, with the kvxbench binary K2 (row NAME.vs), and prints K2's figure over the
# first binary's for each (before/after pairs: BENCH_PATHS_ONLY=staging BENCH_PATHS_VS=new).
set -eu
KVXBENCH=${1:?usage: bench-paths.sh KVXBENCH [ROUNDS]}
ROUNDS=${2:-3}
DUR=${BENCH_PATHS_DURATION:-3s}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
load() { cut -d' ' -f1 /proc/loadavg; }

only() { case "$1" in *"${BENCH_PATHS_ONLY:-}"*) return 0 ;; *) return 1 ;; esac; }

run() { # name flags...
	name=$1
	shift
	only "$name" || return 0
	l=$(load)
	"${BIN:-$KVXBENCH}" run --json --prompts 4k --concurrency 1 --duration "$DUR" "$@" >"$out/$name.json"
	python3 - "$name" "$l" "$out/$name.json" <<'PY' | tee -a "$out/rows"
import json, sys
name, load, path = sys.argv[1:4]
d = json.loads(open(path).read().splitlines()[-1])
print(f'{name} path={d.get("path")} gbps={d["gbps"]:.3f} baseline_gbps={d.get("baseline_gbps", 0):.3f} '
      f'ratio={d.get("ratio", 0):.3f} load={load}')
PY
}

pair() { # name flags...: run, then the same row with $BENCH_PATHS_VS
	run "$@"
	if [ -n "${BENCH_PATHS_VS:-}" ] && [ -z "${BIN:-}" ]; then
		name=$1
		shift
		BIN=$BENCH_PATHS_VS run "$name.vs" "$@"
	fi
}

perftest() { # name test tls flags [VAR=value...]: ucx_perftest of 64 MiB messages on loopback
	name=$1 test=$2 tls=$3 flags=$4
	shift 4
	only "$name" || return 0
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

engine_settings() { # row: the UCX settings the engine of kvxbench row ROW ran with (its env.ucx_settings)
	[ -f "$out/$1.json" ] || return 0
	python3 - "$out/$1.json" <<'PY'
import json, sys
d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(" ".join((d.get("env") or {}).get("ucx_settings") or []))
PY
}

as_engine() { # name row test tls flags: perftest with the UCX settings kvxbench row ROW's engine ran with
	name=$1 row=$2
	shift 2
	only "$name" || return 0
	settings=$(engine_settings "$row")
	if [ -z "$settings" ]; then
		echo "$name skipped: row $row reported no engine settings (not run, or a kvxbench without env.ucx_settings)" | tee -a "$out/skipped"
		return 0
	fi
	# shellcheck disable=SC2086 # one NAME=value word each
	perftest "$name" "$@" $settings
}

memcpy() { # name: kvxbench memcpy, one and two threads, as the lanes rows' host limit
	name=$1
	only "$name" || return 0
	l=$(load)
	"$KVXBENCH" memcpy --rounds 1 >"$out/$name.txt"
	python3 - "$name" "$l" "$out/$name.txt" <<'PY' | tee -a "$out/rows"
import sys
name, load, path = sys.argv[1:4]
g = {}
for line in open(path):
    f = dict(x.split("=", 1) for x in line.split())
    g[f["threads"]] = float(f["gbps"])
print(f'{name} memcpy gbps={g["1"]:.3f} gbps2={g["2"]:.3f} load={load}')
PY
}

i=1
while [ "$i" -le "$ROUNDS" ]; do
	memcpy "r$i.shm.memcpy"
	pair "r$i.shm.lanes" --tls posix,cma,self
	pair "r$i.shm.lane1" --tls posix,cma,self --lanes 1
	perftest "r$i.shm.ucp_get" ucp_get posix,cma,self ""
	pair "r$i.tcp.choice" --tls tcp,self
	pair "r$i.tcp.seg64k" --tls tcp,self --tcp-segment 64KiB
	as_engine "r$i.tcp.tag_bw_kvx" "r$i.tcp.choice" tag_bw tcp,self -e
	pair "r$i.tcp.rma" --tls tcp,self --rma-where-emulated
	pair "r$i.shm.staging" --tls posix,cma,self --staging
	pair "r$i.shm.staging.msg" --tls posix,cma,self --staging --no-pull
	pair "r$i.shm.staging.tp2" --tls posix,cma,self --staging --prefill-tp 2
	pair "r$i.shm.staging.conv" --tls posix,cma,self --staging --decode-order layer-major
	pair "r$i.shm.tp2" --tls posix,cma,self --prefill-tp 2
	pair "r$i.shm.conv" --tls posix,cma,self --decode-order layer-major
	pair "r$i.fifo.staging.msg" --tls posix,cma,self --shm-fifo 1024 --staging --no-pull
	i=$((i + 1))
done

python3 - "$out/rows" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    rows[f[0]] = {k: v for k, v in (x.split("=", 1) for x in f[1:] if "=" in x)}
rounds = sorted({k.split(".")[0] for k in rows})
def g(r, n, k="gbps"):
    return float(rows[f"{r}.{n}"][k]) if f"{r}.{n}" in rows else None
def div(a, b):
    return None if a is None or b is None else a / max(b, 1e-9)
cols = [
    ("lanes/1-lane", lambda r: div(g(r, "shm.lanes"), g(r, "shm.lane1"))),
    ("memcpy2/1", lambda r: div(g(r, "shm.memcpy", "gbps2"), g(r, "shm.memcpy"))),
    ("rma/ucp_get", lambda r: div(g(r, "shm.lanes"), g(r, "shm.ucp_get"))),
    ("tcp-choice/tag_bw", lambda r: g(r, "tcp.choice", "ratio")),
    ("tcp-seg64k/tag_bw", lambda r: g(r, "tcp.seg64k", "ratio")),
    ("tcp-choice/tag_bw(-e,engine's)", lambda r: div(g(r, "tcp.choice"), g(r, "tcp.tag_bw_kvx"))),
    ("tcp-rma/tag_bw", lambda r: g(r, "tcp.rma", "ratio")),
    ("staging/tag_bw", lambda r: g(r, "shm.staging", "ratio")),
    ("staging-msg/tag_bw", lambda r: g(r, "shm.staging.msg", "ratio")),
    ("staging-tp2/tag_bw", lambda r: g(r, "shm.staging.tp2", "ratio")),
    ("staging-conv/tag_bw", lambda r: g(r, "shm.staging.conv", "ratio")),
    ("tp2/tag_bw", lambda r: g(r, "shm.tp2", "ratio")),
    ("conv/tag_bw", lambda r: g(r, "shm.conv", "ratio")),
    ("fifo:staging-msg", lambda r: g(r, "fifo.staging.msg", "ratio")),
]
print()
print("round  " + "  ".join(c for c, _ in cols))
for r in rounds:
    print(f"{r:6} " + "  ".join(("-" if v is None else f"{v:.2f}").rjust(len(c)) for c, f in cols for v in [f(r)]))
vs = sorted(k for k in rows if k.endswith(".vs"))
if vs:
    print()
    print("pairs (BENCH_PATHS_VS): row  ratio  ratio(vs)  gbps(vs)/gbps  load  load(vs)")
    for k in vs:
        a, b = rows[k[:-3]], rows[k]
        print(f'{k[:-3]:24} {float(a["ratio"]):6.3f} {float(b["ratio"]):9.3f} '
              f'{float(b["gbps"]) / max(float(a["gbps"]), 1e-9):14.2f} {a["load"]:>5} {b["load"]:>8}')
PY
