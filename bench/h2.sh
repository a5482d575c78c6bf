#!/usr/bin/env bash
# HTTP/2 over TLS (issue 26 §3): h2load against sessiongate terminating TLS with h2 (server.tls,
# ALPN's default h2 then http/1.1) beside nginx terminating TLS with h2 on the same certificate
# (`listen … ssl http2`, or `http2 on;` from nginx 1.25.1), proxy_passing to the same upstream
# over HTTP/1.1, in one run. h2load offers h2 and http/1.1 as a browser does; a run where
# either server did not choose h2 stops the script.
#
#   nginx-h2 / sessiongate-h2-public         GET /public/: a public route, no cookie
#   nginx-h2-cookie / sessiongate-h2-cached  GET /: the required route, one cached session cookie
#                                            on every stream of every client (nginx ignores it)
#
# The session is made through the product on a plain instance sharing Redis and the secret, as
# bench/tls.sh does; h2load sends one cookie header for all its clients.
# Environment: DURATION (per h2load run, 10s), REPS (3), POINTS: h2load's clients:streams pairs
# (-c and -m; "50:10 200:1"), THREADS (h2load -t, 2), BENCH_NOTE (words for the RESULTS.md
# heading), BIN (another build).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-packages.sh nghttp2-client nginx redis-server python3 openssl
DURATION=${DURATION:-10s}
REPS=${REPS:-3}
POINTS=${POINTS:-"50:10 200:1"}
THREADS=${THREADS:-2}
WORK_NAME=h2
NGINX_TLS=18189 NGINX_TLS_H2=h2
source bench/cert.sh
source bench/lib.sh
tls_gateway public
gateway b $SG_B $ADMIN_B 1h
PID_A=$(cat "$WORK/a.pid")

echo "seeding a session through POST /_auth/native (plain instance B)…"
python3 bench/seed.py "http://127.0.0.1:$SIM" "http://127.0.0.1:$SG_B" 1 1 "$WORK/cookies.txt"
COOKIE="cookie: __Host-sessiongate=$(head -1 "$WORK/cookies.txt")"

NGINX_WORKER=$(pgrep -P "$(cat "$WORK/nginx.pid")" | head -1)
run() {  # scenario clients streams rep|warm duration
  local url pid header=()
  case $1 in
    nginx-h2)              url="https://127.0.0.1:$NGINX_TLS/public/"; pid=$NGINX_WORKER ;;
    sessiongate-h2-public) url="https://127.0.0.1:$SG_A/public/"; pid=$PID_A ;;
    nginx-h2-cookie)       url="https://127.0.0.1:$NGINX_TLS/"; pid=$NGINX_WORKER; header=(-H "$COOKIE") ;;
    sessiongate-h2-cached) url="https://127.0.0.1:$SG_A/"; pid=$PID_A; header=(-H "$COOKIE") ;;
  esac
  local out="$WORK/h2load-$1-$2-$3-$4.txt" before; before=$(cpu "$pid")
  h2load -t"$THREADS" -c"$2" -m"$3" -D"$5" "${header[@]}" --log-file="$WORK/log-$1-$2-$3-$4.tsv" "$url" > "$out" 2>&1 \
    || { cat "$out"; echo "h2load failed against $1 ($url)" >&2; exit 1; }
  echo "$(cpu "$pid") $before" > "$WORK/cpu-$1-$2-$3-$4.txt"
  # h2load takes HTTP/1.1 when the server's ALPN answer is http/1.1: those numbers would not be HTTP/2's.
  grep -qx "Application protocol: h2" "$out" \
    || { cat "$out"; echo "FAILED: $1 ($url) did not negotiate h2 — $(grep 'Application protocol' "$out" || echo 'no protocol reported')" >&2; exit 1; }
}
SCENARIOS="nginx-h2 sessiongate-h2-public nginx-h2-cookie sessiongate-h2-cached"
for point in $POINTS; do
  c=${point%:*}; m=${point#*:}
  for s in $SCENARIOS; do run "$s" "$c" "$m" warm 3s; done  # warms A's cache with the session
  for rep in $(seq "$REPS"); do
    for s in $SCENARIOS; do run "$s" "$c" "$m" "$rep" "$DURATION"; done
  done
done
RSS_A=$(awk '/VmHWM/ {print $2}' "/proc/$PID_A/status")
python3 bench/summarize_h2.py "$WORK" "$POINTS" "$REPS" | tee "$WORK/table.md"
record "HTTP/2 (h2load) over TLS, public route and cached session" \
  "\`make bench\` → \`bench/h2.sh\` (DURATION=$DURATION, REPS=$REPS, POINTS=\"$POINTS\"): \`h2load -t$THREADS -c<clients> -m<streams> -D$DURATION\`, $(nproc) cores shared by h2load, nginx, Redis and sessiongate; $(nginx -v 2>&1 | sed 's/.*: //'), $(h2load --version | head -1); 100-byte responses; the same ECDSA P-256 certificate on both, h2 negotiated by ALPN on every run (checked). nginx terminates TLS and HTTP/2 and proxy_passes over HTTP/1.1 without auth; sessiongate does the same, admitting the cached session on every stream of the required route. CPU is the server process's (nginx's one worker), per request; p99 from h2load's per-request log." \
  "Peak RSS of the TLS instance: $((RSS_A / 1024)) MiB."
