#!/usr/bin/env bash
# Where sessiongate's CPU goes on HTTP/2 over TLS: h2load (-c50 -m1 by default) on the public
# route of a TLS instance, sampled by perf (user space, call graphs), as bench/profile.sh does for
# HTTP/1.1. Not part of `make bench`. Environment: DURATION (8s), H2LOAD ("-c50 -m1"), TOP (25),
# BIN, H1=1 (the same over HTTP/1.1 with h2load --h1, for comparison).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-8s}
H2LOAD=${H2LOAD:-"-c50 -m1"}
TOP=${TOP:-25}
WORK_NAME=h2profile
NGINX_TLS=18194 NGINX_TLS_H2=h2  # not 18190: bench/lib.sh's instance C
source bench/cert.sh
source bench/lib.sh
tls_gateway public
PID_A=$(cat "$WORK/a.pid")
PROTO=(); [ -n "${H1:-}" ] && PROTO=(--h1)
h2load $H2LOAD -D2s "${PROTO[@]}" "https://127.0.0.1:$SG_A/public/" > /dev/null
perf record -q -e cpu-clock:u -g -p "$PID_A" -o "$WORK/perf.data" -- sleep "${DURATION%s}" > /dev/null 2>&1 &
PERF=$!
h2load $H2LOAD -D"$DURATION" "${PROTO[@]}" "https://127.0.0.1:$SG_A/public/" | grep -E "finished in|Application protocol"
wait $PERF || true
perf report -q -i "$WORK/perf.data" --no-children --sort dso,symbol --percent-limit 0.7 2>/dev/null \
  | grep -E "^ +[0-9]" | head -"$TOP" | sed -E 's/\s+$//' | cut -c1-170
