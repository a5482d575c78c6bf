#!/usr/bin/env bash
# The traffic shapes users have (issue 36), each beside nginx proxy_pass (upstream keep-alive)
# in the same run:
#
#   one-user-6    one signed-in user on 6 connections (a browser's HTTP/1.1 connections to a host)
#   one-user-50   one signed-in user on 50 connections (an API client, a sync job)
#   lb, lb-echo   behind a load balancer: every request another of SESSIONS sessions (USERS users),
#                 the app on another host — a network namespace over a veth pair (198.18.0.0/29),
#                 so loopback's TIME_WAIT reuse hides nothing — for LB_DURATION; lb is the default
#                 (upstream_reuse: principal), lb-echo is upstream_reuse: echo (the app echoes
#                 X-Request-Id, one nginx line). Errors, socket errors and the most TIME_WAIT
#                 sockets towards the app (on the gateway's side) seen during the run are counted:
#                 the gateways reach the app at APP_IP, nginx at NGINX_APP_IP, so that nginx's own
#                 (it closes an upstream connection after its keepalive_requests, 1,000) are apart.
#
# Browser-like traffic (one session per connection) is bench/auth.sh's browser rows.
# Environment: DURATION (per one-user run, 10s), REPS (3), LB_DURATION (300s), SESSIONS (10000),
# USERS (10000), BENCH_NOTE, ONLY=one-user (the one-user rows alone: an A/B of the cached path,
# with BIN=) or ONLY=lb, PROFILE=<scenario> (perf samples of that scenario's measured run, the
# top symbols printed; PERF_DATA=<file> keeps them), BIN_B=path/to/other/sessiongate (the one-user rows again on that build, interleaved
# in the same run: one-user-6-b, one-user-50-b). Needs root (ip netns).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
REPS=${REPS:-3}
LB_DURATION=${LB_DURATION:-300s}
SESSIONS=${SESSIONS:-10000}
USERS=${USERS:-10000}
WORK_NAME=shapes
NS=sg-bench-app
HOST_IP=198.18.0.1; APP_IP=198.18.0.2; NGINX_APP_IP=198.18.0.3; APP_PORT=18280; APP_ECHO_PORT=18281; NGINX_LB=18282
SG_L=18283; ADMIN_L=18284; SG_M=18285; ADMIN_M=18286; SG_A2=18287; ADMIN_A2=18288
# nginx on this host: proxy_pass to the app across the veth pair, kept alive, as the baseline.
NGINX_EXTRA="upstream netapp { server $NGINX_APP_IP:$APP_PORT; keepalive 256; }
  server { listen 127.0.0.1:$NGINX_LB; location / { proxy_pass http://netapp; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
source bench/lib.sh

# The app's host: a namespace with its own nginx (100-byte answers; the echo port echoes
# X-Request-Id as upstream_reuse: echo asks), removed at exit with the veth pair.
ip netns del "$NS" 2>/dev/null || true
ip netns add "$NS"
netns_cleanup() {
  [ -f "$WORK/app-nginx.pid" ] && kill "$(cat "$WORK/app-nginx.pid")" 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  cleanup
}
trap netns_cleanup EXIT
ip link add sg-bench0 type veth peer name sg-bench1
ip link set sg-bench1 netns "$NS"
ip addr add "$HOST_IP/29" dev sg-bench0
ip link set sg-bench0 up
ip netns exec "$NS" ip addr add "$APP_IP/29" dev sg-bench1
ip netns exec "$NS" ip addr add "$NGINX_APP_IP/29" dev sg-bench1
ip netns exec "$NS" ip link set sg-bench1 up
ip netns exec "$NS" ip link set lo up
cat > "$WORK/app-nginx.conf" <<CONF
worker_processes 1;
daemon on;
pid $WORK/app-nginx.pid;
error_log $WORK/app-error.log warn;
events { worker_connections 16384; }
http {
  access_log off;
  keepalive_requests 1000000;
  server { listen $APP_PORT reuseport; location / { return 200 "$(printf '%0100d' 0)"; } }
  server { listen $APP_IP:$APP_ECHO_PORT; location / { add_header X-Request-Id \$http_x_request_id always; return 200 "$(printf '%0100d' 0)"; } }
}
CONF
ip netns exec "$NS" nginx -c "$WORK/app-nginx.conf" -p "$WORK"
for _ in $(seq 50); do curl -sf "http://$APP_IP:$APP_PORT/" > /dev/null && curl -sf "http://$NGINX_APP_IP:$APP_PORT/" > /dev/null && break; sleep 0.1; done

# A: the one-user shapes (loopback app); L and M: the load-balancer shapes (the app across the veth).
gateway a $SG_A $ADMIN_A 1h
gateway b $SG_B $ADMIN_B 0s "  exchanges_per_minute: 0"
GATEWAY_UPSTREAM="http://$APP_IP:$APP_PORT" gateway l $SG_L $ADMIN_L 1h "" "  trusted_proxies: [\"127.0.0.1/32\"]"
GATEWAY_UPSTREAM="http://$APP_IP:$APP_ECHO_PORT" gateway m $SG_M $ADMIN_M 1h "" "  trusted_proxies: [\"127.0.0.1/32\"]" "    upstream_reuse: echo"
if [ -n "${BIN_B:-}" ]; then BIN=$BIN_B gateway a2 $SG_A2 $ADMIN_A2 1h; PID_A2=$(cat "$WORK/a2.pid"); fi
PID_A=$(cat "$WORK/a.pid"); PID_L=$(cat "$WORK/l.pid"); PID_M=$(cat "$WORK/m.pid")
NGINX_WORKER=$(pgrep -P "$(cat "$WORK/nginx.pid")" | head -1)

echo "seeding $SESSIONS sessions of $USERS users through POST /_auth/native…"
python3 bench/seed.py "http://127.0.0.1:$SIM" "http://127.0.0.1:$SG_B" "$SESSIONS" "$USERS" "$WORK/cookies.txt"
head -1 "$WORK/cookies.txt" > "$WORK/one.txt"

# TIME_WAIT sockets towards the app, on this host (the gateway's and nginx's side), sampled
# each second while a run lasts: the most seen.
time_wait_peak() {  # pid-of-wrk address-of-the-app
  local peak=0 n
  while kill -0 "$1" 2>/dev/null; do
    n=$(ss -Htan state time-wait dst "$2" | wc -l)
    [ "$n" -gt "$peak" ] && peak=$n
    sleep 1
  done
  echo "$peak"
}

run() {  # scenario rep duration
  local url pid cookies="$WORK/cookies.txt" c=50 threads=2 app=$APP_IP
  case $1 in
    nginx-6)       url="http://127.0.0.1:$NGINX/"; pid=$NGINX_WORKER; cookies="$WORK/one.txt"; c=6 ;;
    one-user-6)    url="http://127.0.0.1:$SG_A/"; pid=$PID_A; cookies="$WORK/one.txt"; c=6 ;;
    nginx-50)      url="http://127.0.0.1:$NGINX/"; pid=$NGINX_WORKER; cookies="$WORK/one.txt" ;;
    one-user-50)   url="http://127.0.0.1:$SG_A/"; pid=$PID_A; cookies="$WORK/one.txt" ;;
    one-user-6-b)  url="http://127.0.0.1:$SG_A2/"; pid=$PID_A2; cookies="$WORK/one.txt"; c=6 ;;
    one-user-50-b) url="http://127.0.0.1:$SG_A2/"; pid=$PID_A2; cookies="$WORK/one.txt" ;;
    nginx-lb)      url="http://127.0.0.1:$NGINX_LB/"; pid=$NGINX_WORKER; app=$NGINX_APP_IP ;;
    lb)            url="http://127.0.0.1:$SG_L/"; pid=$PID_L ;;
    lb-echo)       url="http://127.0.0.1:$SG_M/"; pid=$PID_M ;;
  esac
  local before; before=$(cpu "$pid")
  COOKIES="$cookies" wrk -t"$threads" -c"$c" -d"$3" --latency -s bench/rotate.lua "$url" > "$WORK/wrk-$1-$2.txt" &
  local wrk_pid=$!
  if [ "${PROFILE:-}" = "$1" ] && [ "$2" != warm ]; then
    perf record -q -e cpu-clock:u -g -p "$pid" -o "$WORK/perf-$1.data" -- sleep "${3%s}" > /dev/null 2>&1 &
    local perf_pid=$!
  fi
  time_wait_peak $wrk_pid "$app" > "$WORK/tw-$1-$2.txt"
  wait $wrk_pid
  [ -n "${perf_pid:-}" ] && { wait "$perf_pid" || true; }
  echo "$(cpu "$pid") $before" > "$WORK/cpu-$1-$2.txt"
}

ONE_USER="nginx-6 one-user-6 nginx-50 one-user-50"
[ -n "${BIN_B:-}" ] && ONE_USER="nginx-6 one-user-6 one-user-6-b nginx-50 one-user-50 one-user-50-b"
LB="nginx-lb lb lb-echo"
[ "${ONLY:-}" = one-user ] && LB=""
[ "${ONLY:-}" = lb ] && ONE_USER=""
for s in $ONE_USER; do run "$s" warm 3s; done
[ -n "$ONE_USER" ] || REPS=0
# Every session once at least, on both gateways (each request another session: ~1 s at 10,000/s).
for s in $LB; do run "$s" warm 10s; done
for rep in $(seq "$REPS"); do for s in $ONE_USER; do run "$s" "$rep" "$DURATION"; done; done
for s in $LB; do run "$s" 1 "$LB_DURATION"; done
if [ -n "${PROFILE:-}" ]; then
  perf report -q -i "$WORK/perf-$PROFILE.data" --no-children --sort symbol --percent-limit 0.7 2>/dev/null | grep -E "^ +[0-9]" | head -"${TOP:-40}" | cut -c1-200
  [ -n "${PERF_DATA:-}" ] && cp "$WORK/perf-$PROFILE.data" "$PERF_DATA"
fi
python3 bench/summarize_shapes.py "$WORK" "$REPS" "$ONE_USER $LB" | tee "$WORK/table.md"
# wrk prints "Socket errors" only when there were some: keep those outputs (the work directory goes
# at exit), with the app's listen-queue overflows, to tell a gateway fault from the app's backlog.
if grep -l "Socket errors" "$WORK"/wrk-*.txt > /dev/null 2>&1; then
  keep=$(mktemp -d /tmp/sessiongate-shapes-errors.XXXXXX)
  cp "$WORK"/wrk-*.txt "$keep"/
  ip netns exec "$NS" nstat -az TcpExtListenOverflows TcpExtListenDrops > "$keep/app-nstat.txt" 2>&1 || true
  echo "socket errors: wrk outputs and the app's listen-queue counters kept in $keep"
fi
record "traffic shapes: one user on 6 and 50 connections, behind a load balancer" \
  "\`make bench\` → \`bench/shapes.sh\` (DURATION=$DURATION, REPS=$REPS, LB_DURATION=$LB_DURATION, SESSIONS=$SESSIONS, USERS=$USERS), $(nproc) cores shared by wrk, nginx, Redis, the app and sessiongate; 100-byte responses. one-user: one session cookie on every connection, app on loopback. lb: every request another session, the app's nginx in a network namespace across a veth pair; lb = upstream_reuse principal (the default), lb-echo = upstream_reuse echo; nginx is \`proxy_pass\` with \`keepalive 256\` to the same app." \
  "TIME_WAIT: the most sockets in TIME_WAIT towards the app on the gateway's host, sampled each second of the run, towards the address each proxy dials (nginx's are its own: it closes an upstream connection after 1,000 requests); the ephemeral port range is $(sysctl -n net.ipv4.ip_local_port_range | tr '\t' '-')."
