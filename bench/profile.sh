#!/usr/bin/env bash
# Where sessiongate's CPU goes on the public route: wrk at c=50 against the release build (or
# BIN=…) behind nginx's 100-byte upstream, sampled by perf (user space, call graphs). Prints the
# self-time table of the top symbols and the share of time in each of our modules and in
# retain/release. Not part of `make bench` (it measures nothing against a baseline); used to
# say what each change bought (bench/RESULTS.md).
#
# Environment: DURATION (default 10s), TOP (symbols listed, default 25), CALLERS=<symbol> (also
# print who calls it, e.g. CALLERS=swift_retain), PERF_DATA=<file> (keep the samples, e.g. to
# compare two builds: perf diff old.data new.data), GATEWAY_YAML=<top-level sections> (e.g. a
# tracing: section, to see what it costs).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
TOP=${TOP:-25}
WORK_NAME=profile
source bench/common.sh
command -v perf >/dev/null || { echo "perf is needed (apt-get install linux-perf)"; exit 1; }
UPSTREAM_PORT=18180; NGINX_PORT=18181; SG_PORT=18182; SG_ADMIN=18183
start_nginx $UPSTREAM_PORT $NGINX_PORT
start_public_gateway $SG_PORT $SG_ADMIN $UPSTREAM_PORT sessiongate "$BIN" "${GATEWAY_YAML:-}"
wrk -t2 -c50 -d2s "http://127.0.0.1:$SG_PORT/" > /dev/null  # warm-up
perf record -q -e cpu-clock:u -g -p "$SG_PID" -o "$WORK/perf.data" -- sleep "${DURATION%s}" > /dev/null 2>&1 &
PERF=$!
wrk -t2 -c50 -d"$DURATION" "http://127.0.0.1:$SG_PORT/" | grep -E "Requests/sec"
wait $PERF || true
[ -n "${PERF_DATA:-}" ] && cp "$WORK/perf.data" "$PERF_DATA"
[ -n "${CALLERS:-}" ] && perf report -q -i "$WORK/perf.data" --no-children --sort symbol -S "$CALLERS" -g caller,0.5,callee --percent-limit 0.5 2>/dev/null | head -120
perf report -q -i "$WORK/perf.data" --no-children --sort symbol --percent-limit 0.8 2>/dev/null \
  | grep -E "^ +[0-9]" | head -"$TOP" | sed -E 's/\s+$//' | cut -c1-160
echo "-- self time by area (user space):"
perf report -q -i "$WORK/perf.data" --no-children --sort dso,symbol 2>/dev/null | grep -E "^ +[0-9]" | awk '
  { pct = $1; sub("%", "", pct); line = $0 }
  line ~ /swift_retain|swift_release|swift_bridgeObjectRe/ { a["retain/release"] += pct; next }
  line ~ /HTTPProxy|8HTTPProxy/ { a["HTTPProxy (ours)"] += pct; next }
  line ~ /NIOHTTP1|llhttp|c_nio_llhttp/ { a["NIO HTTP1 codec"] += pct; next }
  line ~ /NIOCore|NIOPosix|7NIOCore|8NIOPosix/ { a["NIO core and posix"] += pct; next }
  line ~ /libc\.so|malloc|free/ { a["libc (malloc, memcpy, …)"] += pct; next }
  { a["other"] += pct }
  END { for (k in a) printf "  %-28s %5.1f %%\n", k, a[k] }' | sort -k2 -rn
