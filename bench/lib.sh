# Shared by bench/auth.sh and bench/revalidation.sh: nginx (upstream + proxy_pass baseline),
# Redis, the Apple ID simulator, and gateway instances sharing Redis and one session secret.
# Set WORK_NAME before sourcing; `gateway NAME PORT ADMIN CACHE_TTL [EXTRA_APPLE_YAML]`.
source bench/common.sh
UPSTREAM=18180; NGINX=18181; SG_A=18182; SG_B=18183; ADMIN_A=18184; ADMIN_B=18185; SIM=18186; REDIS=18187; SG_C=18190; ADMIN_C=18191; SG_D=18192; ADMIN_D=18193
start_nginx $UPSTREAM $NGINX ${NGINX_TLS_ARGS:-}
# STORE=cluster: a Redis Cluster of three masters (no replicas) on ports REDIS, REDIS+1, REDIS+2
# instead of one Redis.
STORE_YAML="  redis_url: \"redis://127.0.0.1:$REDIS/0\""
if [ "${STORE:-redis}" = cluster ]; then
  NODES=()
  for port in $REDIS $((REDIS + 1)) $((REDIS + 2)); do
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --cluster-enabled yes --dir "$WORK" \
      --cluster-config-file "nodes-$port.conf" > "$WORK/redis-$port.log" 2>&1 &
    PIDS+=($!)
    NODES+=("127.0.0.1:$port")
  done
  STORE_YAML="$STORE_YAML
  cluster: { addresses: [$(printf '"%s",' "${NODES[@]}" | sed 's/,$//')] }"
else
  redis-server --port $REDIS --bind 127.0.0.1 --save "" --appendonly no > "$WORK/redis.log" 2>&1 &
  PIDS+=($!)
fi
"$BIN" apple-simulator --listen "127.0.0.1:$SIM" --out "$WORK" --allow-http-loopback --web-client "com.example.web=http://localhost:$SG_A/_auth/callback" \
  --app-id com.example.app > "$WORK/simulator.log" 2>&1 &
PIDS+=($!)
head -c 64 /dev/urandom > "$WORK/session.key"
wait_for() { for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; cat "$1"; exit 1; }
wait_for "$WORK/simulator.log" "private_key_file"
if [ "${STORE:-redis}" = cluster ]; then
  for port in $REDIS $((REDIS + 1)) $((REDIS + 2)); do wait_for "$WORK/redis-$port.log" "Ready to accept connections"; done
  redis-cli --cluster create "${NODES[@]}" --cluster-yes > "$WORK/cluster-create.log" 2>&1
  for _ in $(seq 100); do redis-cli -p $REDIS cluster info | grep -q "cluster_state:ok" && break; sleep 0.1; done
else
  wait_for "$WORK/redis.log" "Ready to accept connections"
fi

# Instance A terminating TLS with CERT_DIR's certificate (bench/cert.sh); `public` adds a public
# route at /public beside the required one.
tls_gateway() {  # [public]
  local public=""
  [ "${1:-}" = public ] && public="
  - name: public
    path_prefix: \"/public\"
    upstream: \"http://127.0.0.1:$UPSTREAM\"
    auth: public"
  gateway a $SG_A $ADMIN_A 1h "" "  tls: { certificate_file: \"$CERT_DIR/cert.pem\", private_key_file: \"$CERT_DIR/key.pem\" }" "$public"
}

gateway() {  # name port admin cache_ttl [extra apple: lines] [extra server: lines] [extra route lines]; GATEWAY_UPSTREAM: another app
  cat > "$WORK/$1.yaml" <<CONF
server:
  listen: "127.0.0.1:$2"
  public_url: "http://localhost:$2"
  admin_listen: "127.0.0.1:$3"
  access_log: off
${6:-}
apple:
  team_id: "SIMTEAM001"
  key_id: "SIMKEY0001"
  client_ids: ["com.example.web", "com.example.app"]
  private_key_file: "$WORK/AuthKey_SIMKEY0001.p8"
  base_url: "http://127.0.0.1:$SIM"
${5:-}
session:
  secret_file: "$WORK/session.key"
store:
$STORE_YAML
  local_cache_ttl: "$4"
routes:
  - name: bench
    upstream: "${GATEWAY_UPSTREAM:-http://127.0.0.1:$UPSTREAM}"
    auth: required
    unauthenticated: deny
${7:-}
CONF
  "$BIN" serve --config "$WORK/$1.yaml" > "$WORK/$1.log" 2>&1 &
  PIDS+=($!)
  echo $! > "$WORK/$1.pid"
  wait_for "$WORK/$1.log" "sessiongate listening"
}
