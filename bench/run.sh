#!/usr/bin/env bash
# Measures, in one run and on loopback: direct → upstream, nginx proxy_pass → upstream, and
# sessiongate → upstream, with wrk at c=50 and c=200, three interleaved repetitions each,
# and reports medians and the sessiongate/nginx ratios. Appends the table to bench/RESULTS.md.
#
# Environment: DURATION (per wrk run, default 10s), CONNECTIONS (default "50 200"), REPS (3),
# BENCH_NOTE (a few words on what changed, put in the RESULTS.md heading).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-"50 200"}
REPS=${REPS:-3}
WORK_NAME=run
source bench/common.sh
UPSTREAM_PORT=18080; NGINX_PORT=18081; SG_PORT=18082; SG_ADMIN=18083
start_nginx $UPSTREAM_PORT $NGINX_PORT

start_public_gateway $SG_PORT $SG_ADMIN $UPSTREAM_PORT

declare -A PORT=([direct]=$UPSTREAM_PORT [nginx]=$NGINX_PORT [sessiongate]=$SG_PORT)
NGINX_WORKER=$(pgrep -P "$(cat "$WORK/nginx.pid")" | head -1)
for c in $CONNECTIONS; do
  for name in direct nginx sessiongate; do wrk -t2 -c"$c" -d2s "http://127.0.0.1:${PORT[$name]}/" >/dev/null; done  # warm-up
  for rep in $(seq "$REPS"); do
    for name in direct nginx sessiongate; do
      before_sg=$(cpu "$SG_PID"); before_ng=$(cpu "$NGINX_WORKER")
      wrk -t2 -c"$c" -d"$DURATION" --latency "http://127.0.0.1:${PORT[$name]}/" > "$WORK/wrk-$name-$c-$rep.txt"
      echo "$(cpu "$SG_PID") $before_sg $(cpu "$NGINX_WORKER") $before_ng" > "$WORK/cpu-$name-$c-$rep.txt"
    done
  done
done
RSS_KB=$(awk '/VmHWM/ {print $2}' "/proc/$SG_PID/status")

python3 bench/summarize.py "$WORK" "$CONNECTIONS" "$REPS" "$RSS_KB" "$DURATION" | tee "$WORK/table.md"
record "data path, public route" \
  "\`make bench\` (DURATION=$DURATION, REPS=$REPS), $(nproc) cores shared by wrk, nginx and sessiongate; 100-byte responses."
