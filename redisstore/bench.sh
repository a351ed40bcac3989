#!/usr/bin/env bash
# Claim benchmarks of redisstore beside redis-benchmark SET NX, on one
# dedicated redis-server this script starts (and kills) on a free port, so
# nothing is left behind and other tests do not share its single thread.
#
#   redisstore/bench.sh            # 3 rounds, medians and ratios at the end
#   ROUNDS=5 redisstore/bench.sh
#   IDEM_BENCH_GOMAXPROCS=2 redisstore/bench.sh   # the Go client on 2 Ps (default 1)
#   PIN=0 redisstore/bench.sh      # no CPU pinning (default: server CPU 0, clients CPU 1)
#   KEEPLOG=1 redisstore/bench.sh  # print the server's log at the end
#
# The Go client runs with GOMAXPROCS=1 by default, as redis-benchmark runs
# one thread: on a 2-core machine shared with the server, a second P costs
# the client more (futex wake-ups, spinning threads) than it gains, and the
# comparison is one client thread against one. docs/benchmarks/redisstore.md
# has both settings side by side.
#
# For each caller count C in 1 8 64 and each round, back to back:
#   redis-benchmark -c C -P 1  SET k x NX PX 60000   vs  Claim with NoCoalesce (single),
#                                                          a bare go-redis SET NX PX (gosetnx: the
#                                                          ceiling of a store on this client)
#                                                      and Claim as configured by default
#                                                          (coalesced; CoalesceInFlight 4,
#                                                          or $IDEM_BENCH_INFLIGHT)
#   redis-benchmark -c C -P 64 SET k x NX PX 60000   vs  ClaimBatch (C goroutines, 64 keys each)
# Targets: single (and coalesced) >= 80% of -P 1, batch >= 50% of -P 64.
set -euo pipefail
cd "$(dirname "$0")"
ROUNDS=${ROUNDS:-3}
gmp=${IDEM_BENCH_GOMAXPROCS:-1}
# PIN=1 (the default on 2 or more CPUs) puts the server on CPU 0 and every
# client (redis-benchmark and ours) on CPU 1, so the scheduler does not move
# them around: the per-round spread at 8 clients fell from 62-97% to
# 79-103% (docs/benchmarks/redisstore.md). PIN=0 turns it off.
PIN=${PIN:-$([ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null && echo 1 || echo 0)}
srvpin=() clipin=()
if [ "$PIN" = 1 ]; then srvpin=(taskset -c 0) clipin=(taskset -c 1); fi
tmp=$(mktemp -d)
port=""
for _ in $(seq 50); do
  p=$((20000 + RANDOM % 20000))
  if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || { echo "no free port" >&2; exit 1; }
"${srvpin[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --logfile "$tmp/redis.log" --dir "$tmp" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; [ -n "${KEEPLOG:-}" ] && cat "$tmp/redis.log" >&2; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
go test -c -o "$tmp/redisstore.test" . >/dev/null

usec() { # command -> server µs per call since the last reset (INFO commandstats)
  redis-cli -p "$port" info commandstats | tr -d '\r' |
    awk -F'[=,]' -v c="cmdstat_$1:" 'index($0, c) == 1 {print $6; f=1} END {if (!f) print 0}'
}
# Every measured step starts from an empty keyspace: without it each step
# ran on the keys the step before it left (redis-benchmark's keys live for
# PX 60000), so the dict was rehashing into a larger table while the
# next step ran, which penalised whichever step came second.
reset() { redis-cli -p "$port" flushall >/dev/null; redis-cli -p "$port" config resetstat >/dev/null; }
rb() { # clients pipeline requests -> "rps p50ms p99ms"
  reset
  "${clipin[@]}" redis-benchmark -p "$port" -c "$1" -P "$2" -n "$3" -r 100000000 --csv \
    SET 'idembench:__rand_int__' x NX PX 60000 |
    awk -F'","' 'NR==2 {print $2, $5, $7}'
}
ours() { # sub-benchmark count -> "claims/s p50µs p99µs"
  reset
  GOMAXPROCS="$gmp" IDEM_BENCH_REDIS="127.0.0.1:$port" "${clipin[@]}" "$tmp/redisstore.test" -test.run '^$' \
    -test.bench "^BenchmarkClaim/$1\$" -test.benchtime "${2}x" |
    awk '/claims\/s/ {for (i=1;i<=NF;i++) {if ($(i+1)=="claims/s") r=$i; if ($(i+1)=="p50-µs") a=$i; if ($(i+1)=="p99-µs") b=$i}; print r, a, b}'
}

echo "server: redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$port; $(nproc) CPUs; client GOMAXPROCS=$gmp; PIN=$PIN; load: $(cut -d' ' -f1-3 /proc/loadavg)"
row() { # mode claims/s p50µs p99µs, beside this step's baseline (brps bp50 bp99)
  printf '%-6s %-9s %3s | %12.0f %8.3f %8.3f | %12.0f %8.3f %8.3f | %5.0f%%\n' "$r" "$1" "$c" \
    "$brps" "$bp50" "$bp99" "$2" "$(echo "$3/1000" | bc -l)" "$(echo "$4/1000" | bc -l)" "$(echo "100*$2/$brps" | bc -l)"
}
printf '%-6s %-9s %3s | %12s %8s %8s | %12s %8s %8s | %6s\n' round mode C "SET NX/s" p50ms p99ms "claims/s" p50ms p99ms ratio
res="$tmp/results"
for r in $(seq "$ROUNDS"); do
  for c in 1 8 64; do
    n1=$((c == 1 ? 20000 : 60000))
    read -r brps bp50 bp99 < <(rb "$c" 1 "$n1")
    setus=$(usec set)
    read -r ors op50 op99 < <(ours "single/callers=$c" "$n1")
    echo "single $c $brps $ors" >>"$res"
    echo "single $c $setus $(usec evalsha)" >>"$tmp/cpu"
    row single "$ors" "$op50" "$op99"
    read -r gs gp50 gp99 < <(ours "gosetnx/callers=$c" "$n1")
    echo "gosetnx $c $brps $gs" >>"$res"
    echo "vsgosetnx $c $gs $ors" >>"$res" # $ors: this round's single claims
    row gosetnx "$gs" "$gp50" "$gp99"
    read -r ors op50 op99 < <(ours "coalesced/callers=$c" "$n1")
    echo "coalesced $c $brps $ors" >>"$res"
    echo "coalesced $c $setus $(usec evalsha)" >>"$tmp/cpu"
    row coalesced "$ors" "$op50" "$op99"
    n2=$((c == 1 ? 200000 : 400000))
    read -r brps bp50 bp99 < <(rb "$c" 64 "$n2")
    setus=$(usec set)
    read -r ors op50 op99 < <(ours "batch64/callers=$c" "$n2")
    echo "batch $c $brps $ors" >>"$res"
    echo "batch $c $setus $(echo "$(usec evalsha)/64" | bc -l)" >>"$tmp/cpu"
    row batch64 "$ors" "$op50" "$op99"
  done
done
echo
echo "medians over $ROUNDS rounds (ratio = median of the per-round ratios; target single >= 80%, batch >= 50%;"
echo "gosetnx: a bare go-redis SET NX PX per call, the same harness, no claim; vsgosetnx: single Claim vs gosetnx)"
for mode in single coalesced batch gosetnx vsgosetnx; do
  for c in 1 8 64; do
    awk -v m="$mode" -v c="$c" '$1==m && $2==c {print $3, $4, $4/$3}' "$res" >"$tmp/sel"
    med() { sort -g -k"$1" "$tmp/sel" | awk -v k="$1" '{v[NR]=$k} END {print v[int((NR+1)/2)]}'; }
    printf '%-9s C=%-3s SET NX %10.0f/s  claims %10.0f/s  ratio %4.0f%%\n' "$mode" "$c" "$(med 1)" "$(med 2)" "$(echo "100*$(med 3)" | bc -l)"
  done
done
echo
echo "server CPU per operation (INFO commandstats usec_per_call, medians; batch: per claim = per script / 64;"
echo "coalesced: per script, which carries a varying number of claims)"
for mode in single coalesced batch; do
  for c in 1 8 64; do
    awk -v m="$mode" -v c="$c" '$1==m && $2==c {print $3, $4, $4/$3}' "$tmp/cpu" >"$tmp/sel"
    med() { sort -g -k"$1" "$tmp/sel" | awk -v k="$1" '{v[NR]=$k} END {print v[int((NR+1)/2)]}'; }
    printf '%-9s C=%-3s SET NX %6.2f us  claim %6.2f us  (claim/SET %4.1fx)\n' "$mode" "$c" "$(med 1)" "$(med 2)" "$(med 3)"
  done
done
