#!/usr/bin/env bash
# What tracing costs (issue 28 §3), in one run on loopback, beside nginx proxy_pass: the public
# route through four gateways at once, requests interleaved —
#
#   before   BASELINE_BIN (optional): a build without tracing, to show that "off" costs nothing
#   off      no tracing: section
#   1%       tracing, sample_ratio 0.01
#   100%     tracing, sample_ratio 1: every request's four spans (request, admission, upstream,
#            connect) exported
#
# The collector is nginx answering 200 to every export (the gateway's side of the cost, not a
# collector's); it is the same worker as the upstream and the proxy_pass baseline.
# Environment: DURATION (10s), CONNECTIONS ("50"), REPS (3), BASELINE_BIN, BENCH_NOTE.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-50}
REPS=${REPS:-3}
WORK_NAME=tracing
source bench/common.sh
UPSTREAM=18180; NGINX=18181; COLLECTOR=18182
NGINX_EXTRA="server { listen 127.0.0.1:$COLLECTOR; client_body_buffer_size 1m; location / { return 200; } }" start_nginx $UPSTREAM $NGINX
NGINX_WORKER=$(pgrep -P "$(cat "$WORK/nginx.pid")" | head -1)

tracing() { printf 'tracing:\n  endpoint: "http://127.0.0.1:%s/v1/traces"\n  sample_ratio: %s\n' "$COLLECTOR" "$1"; }
declare -A PORT ADMIN PID
SCENARIOS=(off 1% 100%)
[ -n "${BASELINE_BIN:-}" ] && SCENARIOS=(before "${SCENARIOS[@]}")
port=18183
for name in "${SCENARIOS[@]}"; do
  PORT[$name]=$port; ADMIN[$name]=$((port + 1)); port=$((port + 2))
  case $name in
    before) start_public_gateway "${PORT[$name]}" "${ADMIN[$name]}" $UPSTREAM before "$BASELINE_BIN" ;;
    off) start_public_gateway "${PORT[$name]}" "${ADMIN[$name]}" $UPSTREAM off ;;
    1%) start_public_gateway "${PORT[$name]}" "${ADMIN[$name]}" $UPSTREAM one "$BIN" "$(tracing 0.01)" ;;
    100%) start_public_gateway "${PORT[$name]}" "${ADMIN[$name]}" $UPSTREAM all "$BIN" "$(tracing 1)" ;;
  esac
  PID[$name]=$SG_PID
done
PORT[nginx]=$NGINX; PID[nginx]=$NGINX_WORKER

ALL=(nginx "${SCENARIOS[@]}")
for c in $CONNECTIONS; do
  for name in "${ALL[@]}"; do wrk -t2 -c"$c" -d2s "http://127.0.0.1:${PORT[$name]}/" >/dev/null; done  # warm-up
  for rep in $(seq "$REPS"); do
    for name in "${ALL[@]}"; do
      before=$(cpu "${PID[$name]}")
      wrk -t2 -c"$c" -d"$DURATION" --latency "http://127.0.0.1:${PORT[$name]}/" > "$WORK/wrk-${name/\%/pc}-$c-$rep.txt"
      echo "$(cpu "${PID[$name]}") $before" > "$WORK/cpu-${name/\%/pc}-$c-$rep.txt"
    done
  done
done
sleep 2  # the last export (each second)
for name in 1% 100%; do
  curl -s "http://127.0.0.1:${ADMIN[$name]}/metrics" | awk -v n="$name" '/^sessiongate_tracing_spans_(exported|dropped)_total/ {print n, $1, $2}'
done > "$WORK/spans.txt"
for name in "${SCENARIOS[@]}"; do echo "$name $(awk '/VmHWM/ {print $2}' "/proc/${PID[$name]}/status")"; done > "$WORK/rss.txt"

python3 - "$WORK" "$CONNECTIONS" "$REPS" "${ALL[@]}" <<'PY' | tee "$WORK/table.md"
import statistics, sys
sys.path.insert(0, "bench")
import wrkparse
work, connections, reps, names = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4:]
rss = dict(line.split() for line in open(f"{work}/rss.txt"))
print("| c | target | req/s (median) | p50 ms | p99 ms | CPU µs/req | req/s vs nginx | req/s vs off | CPU vs off | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for c in connections:
    med = {}
    for name in names:
        runs = []
        for r in range(1, reps + 1):
            key = name.replace("%", "pc")
            w = wrkparse.parse(f"{work}/wrk-{key}-{c}-{r}.txt")
            after, before = map(float, open(f"{work}/cpu-{key}-{c}-{r}.txt").read().split())
            runs.append((w["rps"], w["p50"], w["p99"], (after - before) / w["total"] * 1e6))
        med[name] = [statistics.median(run[i] for run in runs) for i in range(4)]
    for name in names:
        rps, p50, p99, cpu = med[name]
        vs_off = f"{rps / med['off'][0]:.3f}" if name != "nginx" else "—"
        cpu_off = f"{cpu / med['off'][3]:.3f}" if name != "nginx" else "—"
        mem = f"{int(rss[name]) / 1024:.0f}" if name in rss else "—"
        print(f"| {c} | {name} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {cpu:.1f} | {rps / med['nginx'][0]:.2f} | {vs_off} | {cpu_off} | {mem} |")
PY
echo; cat "$WORK/spans.txt"
record "tracing: off, 1 %, 100 %" \
  "\`bench/tracing.sh\` (DURATION=$DURATION, REPS=$REPS${BASELINE_BIN:+, BASELINE_BIN=$BASELINE_BIN}), $(nproc) cores shared by wrk, nginx (upstream, proxy_pass and collector) and four gateways; 100-byte responses, the public route." \
  "Spans at the end of the run: $(tr '\n' ';' < "$WORK/spans.txt" | sed 's/;$//; s/;/; /g')."
