#!/usr/bin/env bash
# Authenticated scenarios with 10,000 distinct sessions (issue 4), measured in one run beside
# nginx proxy_pass: every request carries a session cookie, rotating through all of them
# (bench/rotate.lua).
#
#   cached     the session is in the gateway's local cache (store.local_cache_ttl 1h, warmed);
#              upstream_reuse: principal (the default): each request is another user, so it
#              rarely finds an idle upstream connection of its own
#   shared     the same on instance C, whose route has upstream_reuse: shared
#   redis-shared  instance D: the local cache off, upstream_reuse shared — beside `shared`, what
#              the cache alone buys (with principal reuse, most rotating requests open a new
#              upstream connection, and that cost hides the store's)
#   browser, browser-shared, nginx-browser   browser-like: each connection keeps one session
#              (wrk with one thread per connection, STICKY=1), on A, C and nginx
#   redis      local cache off (ttl 0): every request reads Redis (one round trip: a script reads
#              the session, the profile and the revocation marker)
#   no-cookie  a required route without a credential: 401 from the gateway, no store call
#   forged     a well-formed cookie with a wrong HMAC: 401, no store call
#
# Sessions are made through the product (simulator + POST /_auth/native, bench/seed.py) in
# Redis, shared by two gateway instances with the same secret: A with the cache, B without.
# Environment as bench/run.sh: DURATION, CONNECTIONS, REPS, SESSIONS (10000), BENCH_NOTE.
# STORE=cluster: the gateways share a Redis Cluster of three masters instead of one Redis.
# PROFILE=cached (or redis, forged, no-cookie): instead of measuring, sample that scenario with
# perf once the cache is warm and print where its CPU goes (inclusive, our symbols first);
# PERF_DATA=<file> keeps the samples (perf report -i <file> --no-children: self time);
# PERF_EVENT=<event> samples another event (e.g. probe_libc:malloc after `perf probe -x libc.so.6
# malloc`: who allocates, every call counted).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-"50 200"}
REPS=${REPS:-3}
SESSIONS=${SESSIONS:-10000}
# The cached scenario's warm-up (the others': 3 s). Long enough for wrk's two threads to request
# every session (make bench: 100 s at 100,000 sessions, ~3,000 req/s), else the cache is never
# full and the run measures first sightings, not the cache.
WARM_CACHED=${WARM_CACHED:-3s}
WORK_NAME=auth
source bench/lib.sh
# B takes the sign-ins that seed the sessions (so that A's peak memory is its cache's, not the
# seeding's): without a limit on code exchanges, since 100,000 sessions for 1,000 users are 100
# sign-ins per user, over the default 30 per user and minute (429). Seeding more users instead
# would make the 100,000-session run differ from the 10,000-session one and from earlier runs
# in more than the number of sessions (upstream connections are kept per user).
gateway a $SG_A $ADMIN_A 1h
gateway b $SG_B $ADMIN_B 0s "  exchanges_per_minute: 0"
gateway c $SG_C $ADMIN_C 1h "" "" "    upstream_reuse: shared"
gateway d $SG_D $ADMIN_D 0s "" "" "    upstream_reuse: shared"
PID_A=$(cat "$WORK/a.pid"); PID_B=$(cat "$WORK/b.pid"); PID_C=$(cat "$WORK/c.pid"); PID_D=$(cat "$WORK/d.pid")

echo "seeding $SESSIONS sessions through POST /_auth/native…"
python3 bench/seed.py "http://127.0.0.1:$SIM" "http://127.0.0.1:$SG_B" "$SESSIONS" 1000 "$WORK/cookies.txt"
python3 -c "
import base64, os
for _ in range($SESSIONS): print(base64.urlsafe_b64encode(os.urandom(64)).decode().rstrip('='))" > "$WORK/forged.txt"

NGINX_WORKER=$(pgrep -P "$(cat "$WORK/nginx.pid")" | head -1)
# Instance A's cache counters: hits, misses, evictions.
cache_counts() {
  curl -s "http://127.0.0.1:$ADMIN_A/metrics" | awk '/^sessiongate_session_cache_total.*"hit"/ {h=$2} /^sessiongate_session_cache_total.*"miss"/ {m=$2}
    /^sessiongate_session_cache_evictions_total/ {e=$2} END {print h+0, m+0, e+0}'
}
run() {  # scenario c rep|warm duration
  local url script="" cookies="" pid=$PID_A threads=2 sticky=""
  case $1 in
    # nginx carries the same rotating cookies (it ignores them): wrk does the same work for both.
    nginx)     url="http://127.0.0.1:$NGINX/"; pid=$NGINX_WORKER; script=bench/rotate.lua; cookies="$WORK/cookies.txt" ;;
    cached)    url="http://127.0.0.1:$SG_A/"; script=bench/rotate.lua; cookies="$WORK/cookies.txt" ;;
    shared)    url="http://127.0.0.1:$SG_C/"; script=bench/rotate.lua; cookies="$WORK/cookies.txt"; pid=$PID_C ;;
    nginx-browser) url="http://127.0.0.1:$NGINX/"; pid=$NGINX_WORKER; script=bench/rotate.lua; cookies="$WORK/cookies.txt"; threads=$2; sticky=1 ;;
    browser)   url="http://127.0.0.1:$SG_A/"; script=bench/rotate.lua; cookies="$WORK/cookies.txt"; threads=$2; sticky=1 ;;
    browser-shared) url="http://127.0.0.1:$SG_C/"; script=bench/rotate.lua; cookies="$WORK/cookies.txt"; pid=$PID_C; threads=$2; sticky=1 ;;
    redis)     url="http://127.0.0.1:$SG_B/"; script=bench/rotate.lua; cookies="$WORK/cookies.txt"; pid=$PID_B ;;
    redis-shared) url="http://127.0.0.1:$SG_D/"; script=bench/rotate.lua; cookies="$WORK/cookies.txt"; pid=$PID_D ;;
    no-cookie) url="http://127.0.0.1:$SG_A/" ;;
    forged)    url="http://127.0.0.1:$SG_A/"; script=bench/rotate.lua; cookies="$WORK/forged.txt" ;;
  esac
  local before counts; before=$(cpu "$pid")
  [ "$1" = cached ] && counts=$(cache_counts)
  STICKY="$sticky" COOKIES="$cookies" wrk -t"$threads" -c"$2" -d"$4" --latency ${script:+-s "$script"} "$url" > "$WORK/wrk-$1-$2-$3.txt"
  echo "$(cpu "$pid") $before" > "$WORK/cpu-$1-$2-$3.txt"
  if [ "$1" = cached ]; then echo "$(cache_counts) $counts" > "$WORK/cache-$2-$3.txt"; fi
}
SCENARIOS=${SCENARIOS:-"nginx cached shared redis redis-shared no-cookie forged nginx-browser browser browser-shared"}
for c in $CONNECTIONS; do
  for s in $SCENARIOS; do run "$s" "$c" warm "$([ "$s" = cached ] && echo "$WARM_CACHED" || echo 3s)"; done  # warms A's cache
  if [ -n "${PROFILE:-}" ]; then  # PROFILE=cached|redis|forged|no-cookie: where that scenario's CPU goes, then stop
    pid=$PID_A; [ "$PROFILE" = redis ] && pid=$PID_B; case $PROFILE in shared|browser-shared) pid=$PID_C ;; redis-shared) pid=$PID_D ;; esac
    perf record -q -e "${PERF_EVENT:-cpu-clock:u}" -g -p "$pid" -o "$WORK/perf.data" -- sleep "${DURATION%s}" > /dev/null 2>&1 &
    PERF=$!
    run "$PROFILE" "$c" profile "$DURATION"
    wait $PERF || true
    [ -n "${PERF_DATA:-}" ] && cp "$WORK/perf.data" "$PERF_DATA"
    grep Requests/sec "$WORK/wrk-$PROFILE-$c-profile.txt"
    perf report -q -i "$WORK/perf.data" --children --sort symbol --percent-limit 0.7 -g none 2>/dev/null | grep -E "^ +[0-9]" \
      | grep -vE "NIOPosix|start_thread|NIOThread" | cut -c1-200 | head -"${TOP:-70}"
    exit 0
  fi
  for rep in $(seq "$REPS"); do
    for s in $SCENARIOS; do run "$s" "$c" "$rep" "$DURATION"; done
  done
done
RSS_A=$(awk '/VmHWM/ {print $2}' "/proc/$PID_A/status"); RSS_B=$(awk '/VmHWM/ {print $2}' "/proc/$PID_B/status")
RSS_C=$(awk '/VmHWM/ {print $2}' "/proc/$PID_C/status"); RSS_D=$(awk '/VmHWM/ {print $2}' "/proc/$PID_D/status")
python3 bench/summarize_auth.py "$WORK" "$CONNECTIONS" "$REPS" "$SCENARIOS" | tee "$WORK/table.md"
CACHE_A=$(for f in "$WORK"/cache-*.txt; do
  # (no file: the run had no cached scenario)
  if [ -f "$f" ]; then awk -v run="$(basename "$f" .txt | sed 's/^cache-//')" '{h = $1 - $4; n = h + $2 - $5
    printf "%s: %.1f %% hits of %d lookups, %d evictions\n", run, n ? 100 * h / n : 0, n, $3 - $6}' "$f"; fi
done | paste -sd ';' | sed 's/;/; /g')
echo "cache A during the cached runs (connections-rep): $CACHE_A"
record "authenticated, $SESSIONS distinct sessions" \
  "\`make bench\` → \`${STORE:+STORE=$STORE }bench/auth.sh\` (DURATION=$DURATION, REPS=$REPS, CONNECTIONS="$CONNECTIONS", SCENARIOS="$SCENARIOS"), $(nproc) cores shared by wrk, nginx, Redis and sessiongate; 100-byte responses; cookies rotate through all sessions (\`bench/rotate.lua\`), except the browser-like rows (one session per connection, wrk with a thread per connection, compared with nginx-browser). nginx is \`proxy_pass\` without any auth. cached/browser: upstream_reuse principal; shared/browser-shared: upstream_reuse shared; redis-shared: shared, cache off." \
  "Peak RSS: instance A (cache on) $((RSS_A / 1024)) MiB, instance B (cache off) $((RSS_B / 1024)) MiB, instance C (shared reuse) $((RSS_C / 1024)) MiB, instance D (shared reuse, cache off) $((RSS_D / 1024)) MiB; B took the seeding sign-ins." \
  ${CACHE_A:+"Instance A's cache during the cached runs (connections-rep): $CACHE_A."}
