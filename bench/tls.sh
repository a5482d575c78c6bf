#!/usr/bin/env bash
# TLS termination (issue 11 §5): the authenticated route over https, sessiongate terminating
# TLS (server.tls) beside nginx terminating TLS with the same certificate (`listen … ssl`,
# proxy_pass to the same upstream), in one run; with keep-alive, and with one request per
# connection (every request pays a full handshake: ECDHE P-256 + ECDSA P-256, no session
# resumption on either side).
#
#   nginx-tls / sessiongate-tls              keep-alive, a cached session cookie on every request
#   nginx-tls-close / sessiongate-tls-close  `Connection: close`: a new TLS connection per request
#
# Sessions are made through the product on a plain instance sharing Redis and the secret.
# Environment as bench/run.sh: DURATION, CONNECTIONS, REPS, SESSIONS (1000), BENCH_NOTE.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-"50 200"}
REPS=${REPS:-3}
SESSIONS=${SESSIONS:-1000}
WORK_NAME=tls
NGINX_TLS=18188
source bench/cert.sh
source bench/lib.sh
tls_gateway
gateway b $SG_B $ADMIN_B 1h
PID_A=$(cat "$WORK/a.pid")

echo "seeding $SESSIONS sessions through POST /_auth/native (plain instance B)…"
python3 bench/seed.py "http://127.0.0.1:$SIM" "http://127.0.0.1:$SG_B" "$SESSIONS" 500 "$WORK/cookies.txt"

NGINX_WORKER=$(pgrep -P "$(cat "$WORK/nginx.pid")" | head -1)
run() {  # scenario c rep|warm duration
  local url pid close=0
  case $1 in
    nginx-tls)             url="https://127.0.0.1:$NGINX_TLS/"; pid=$NGINX_WORKER ;;
    sessiongate-tls)       url="https://127.0.0.1:$SG_A/"; pid=$PID_A ;;
    nginx-tls-close)       url="https://127.0.0.1:$NGINX_TLS/"; pid=$NGINX_WORKER; close=1 ;;
    sessiongate-tls-close) url="https://127.0.0.1:$SG_A/"; pid=$PID_A; close=1 ;;
  esac
  local before; before=$(cpu "$pid")
  CLOSE=$close COOKIES="$WORK/cookies.txt" wrk -t2 -c"$2" -d"$4" --latency -s bench/rotate.lua "$url" > "$WORK/wrk-$1-$2-$3.txt"
  echo "$(cpu "$pid") $before" > "$WORK/cpu-$1-$2-$3.txt"
}
SCENARIOS="nginx-tls sessiongate-tls nginx-tls-close sessiongate-tls-close"
for c in $CONNECTIONS; do
  for s in $SCENARIOS; do run "$s" "$c" warm 3s; done
  for rep in $(seq "$REPS"); do
    for s in $SCENARIOS; do run "$s" "$c" "$rep" "$DURATION"; done
  done
done
RSS_A=$(awk '/VmHWM/ {print $2}' "/proc/$PID_A/status")
python3 bench/summarize_tls.py "$WORK" "$CONNECTIONS" "$REPS" | tee "$WORK/table.md"
record "TLS termination, authenticated route (cached session)" \
  "\`make bench\` → \`bench/tls.sh\` (DURATION=$DURATION, REPS=$REPS), $(nproc) cores shared by wrk, nginx, Redis and sessiongate; 100-byte responses; the same ECDSA P-256 certificate on both; no session resumption. nginx terminates TLS and proxy_passes without auth; sessiongate admits a cached session on every request." \
  "Peak RSS of the TLS instance: $((RSS_A / 1024)) MiB."
