#!/usr/bin/env bash
# Issue 5's bench: a re-validation storm and the revocation propagation delay, with two gateway
# instances sharing Redis.
#
# Storm: SESSIONS real sessions (bench/seed.py) with apple.revalidate_after=REVALIDATE_AFTER, so
# they all come due within the seeding time (+ jitter) of each other; the simulator answers
# every Apple call after 100 ms. The hot path (instance A, cache on, cookies rotating through all
# sessions) is measured before the sessions are due and while they all come due; the
# simulator's refresh-call count must equal the number of distinct refresh tokens (one per
# session). revalidate_grace is long, so due sessions are forwarded and validated in the
# background.
#
# Propagation: 100 users disconnect on instance A (POST /_auth/revoke); each time, another of
# the user's sessions is polled on instance B until B refuses it (bench/propagation.py).
set -euo pipefail
cd "$(dirname "$0")/.."
SESSIONS=${SESSIONS:-10000}
REVALIDATE_AFTER=${REVALIDATE_AFTER:-150}   # seconds; must exceed the seeding time
STORM=${STORM:-}   # default: the seeding time + 15 s, so that every session comes due inside it
WORK_NAME=revalidation
source bench/lib.sh
APPLE_EXTRA="  revalidate_after: \"${REVALIDATE_AFTER}s\"
  revalidate_grace: \"1h\""
gateway a $SG_A $ADMIN_A 1h "$APPLE_EXTRA"
gateway b $SG_B $ADMIN_B 1h "$APPLE_EXTRA"
PID_A=$(cat "$WORK/a.pid")

seed_start=$(date +%s)
echo "seeding $SESSIONS sessions…"
python3 bench/seed.py "http://127.0.0.1:$SIM" "http://127.0.0.1:$SG_A" "$SESSIONS" 1000 "$WORK/cookies.txt"
seed_end=$(date +%s)
[ $((seed_end - seed_start + 20)) -lt "$REVALIDATE_AFTER" ] || { echo "seeding took $((seed_end - seed_start)) s: raise REVALIDATE_AFTER"; exit 1; }
STORM=${STORM:-$((seed_end - seed_start + 15))s}
curl -s -X POST -H 'content-type: application/json' -d '{"latency_ms": 100}' "http://127.0.0.1:$SIM/sim/faults" > /dev/null
refreshes() { curl -s "http://127.0.0.1:$SIM/sim/counters" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("/auth/token#refresh_token", 0))'; }

measure() {  # label duration
  local before; before=$(cpu "$PID_A")
  COOKIES="$WORK/cookies.txt" wrk -t2 -c50 -d"$2" --latency -s bench/rotate.lua "http://127.0.0.1:$SG_A/" > "$WORK/wrk-$1.txt"
  echo "$(cpu "$PID_A") $before" > "$WORK/cpu-$1.txt"
}
COOKIES="$WORK/cookies.txt" wrk -t2 -c50 -d5s -s bench/rotate.lua "http://127.0.0.1:$SG_A/" > /dev/null   # warm A's cache
before_refresh=$(refreshes)
measure calm 15s
[ "$(refreshes)" = "$before_refresh" ] || echo "WARNING: refreshes happened before the storm"
wait_until=$((seed_start + REVALIDATE_AFTER))
now=$(date +%s); [ "$now" -lt "$wait_until" ] && sleep $((wait_until - now))
measure storm "$STORM"
# The validations still queued when wrk stops (at most 32 at a time, 100 ms each, plus their
# store round trips) finish: wait until Apple's count stops moving (2 s unchanged, 30 s at most).
last=-1; same=0
for _ in $(seq 60); do
  n=$(refreshes)
  if [ "$n" = "$last" ]; then same=$((same + 1)); [ $same -ge 4 ] && break; else same=0; last=$n; fi
  sleep 0.5
done
storm_refresh=$(( $(refreshes) - before_refresh ))
curl -s -X POST -H 'content-type: application/json' -d '{"latency_ms": 0}' "http://127.0.0.1:$SIM/sim/faults" > /dev/null

failed_validations=$(cat "$WORK/a.log" "$WORK/b.log" | grep -c "during re-validation" || true)
python3 bench/propagation.py "http://127.0.0.1:$SG_A" "http://127.0.0.1:$SG_B" "$WORK/cookies.txt" 100 1000 > "$WORK/propagation.txt"

python3 - "$WORK" "$SESSIONS" "$storm_refresh" "$failed_validations" <<'PY' | tee "$WORK/table.md"
import sys
sys.path.insert(0, "bench")
import wrkparse
work, sessions, refreshes, failed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def parse(label):
    w = wrkparse.parse(f"{work}/wrk-{label}.txt")
    after, before = map(float, open(f"{work}/cpu-{label}.txt").read().split())
    return w["rps"], w["p99"], (after - before) / w["total"] * 1e6, w["non2xx"]
calm, storm = parse("calm"), parse("storm")
print("| phase | req/s | p99 ms | CPU µs/req | non-2xx | req/s vs calm | p99 vs calm |")
print("|---|---|---|---|---|---|---|")
for name, (rps, p99, cpu, bad) in (("calm (nothing due)", calm), ("storm (every session comes due)", storm)):
    print(f"| {name} | {rps:,.0f} | {p99:.2f} | {cpu:.1f} | {bad} | {rps / calm[0]:.2f}× | {p99 - calm[1]:+.2f} ms |")
print()
print(f"Apple refresh calls during the storm: {refreshes} for {sessions} distinct refresh tokens ({'equal' if refreshes == sessions else 'NOT equal'}); "
      f"validations that failed and were retried (Apple unreachable or slower than apple.timeout): {failed}.")
print()
print(open(f"{work}/propagation.txt").read().strip())
PY
record "re-validation storm and revocation propagation, $SESSIONS sessions, two instances" \
  "\`make bench\` → \`${STORE:+STORE=$STORE }bench/revalidation.sh\` (REVALIDATE_AFTER=${REVALIDATE_AFTER}s, storm measured for $STORM, simulator latency 100 ms, revalidate_grace 1h), $(nproc) cores shared by wrk, Redis, the simulator and both gateways."
