# Sourced by every bench script: the release binary, a work directory, processes stopped at exit
# (append background pids to PIDS), and nginx as the upstream (100-byte answers) plus the
# `proxy_pass` baseline (1 worker, upstream keep-alive). Set WORK_NAME before sourcing.
BIN=${BIN:-.build/release/sessiongate}  # BIN=path/to/other/sessiongate: measure another build (A/B)
[ -x "$BIN" ] || { echo "build first: make release (make bench does)"; exit 1; }
WORK=$(mktemp -d "/tmp/sessiongate-bench-${WORK_NAME:-run}.XXXXXX")
PIDS=()
cleanup() {
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK" ${CERT_DIR:+"$CERT_DIR"}  # CERT_DIR: a TLS script's certificate, made before sourcing
}
trap cleanup EXIT

start_nginx() {  # upstream_port proxy_port [tls_port cert key [h2]]: the third adds proxy_pass behind TLS, h2 with HTTP/2; NGINX_EXTRA: more server blocks
  local tls_server="" listen_h2="" server_h2=""
  if [ "${6:-}" = h2 ]; then  # `http2 on;` since nginx 1.25.1; before it, `listen … ssl http2`
    if printf '%s\n' 1.25.1 "$(nginx -v 2>&1 | sed -n 's|.*nginx/\([0-9.]*\).*|\1|p')" | sort -V -C; then server_h2="http2 on;"; else listen_h2=" http2"; fi
  fi
  [ -n "${3:-}" ] && tls_server="server { listen 127.0.0.1:$3 ssl$listen_h2; $server_h2 ssl_certificate $4; ssl_certificate_key $5; ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache off; ssl_session_tickets off; location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
  cat > "$WORK/nginx.conf" <<CONF
worker_processes 1;
daemon on;
pid $WORK/nginx.pid;
error_log $WORK/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream app { server 127.0.0.1:$1; keepalive 256; }
  server { listen 127.0.0.1:$1; location / { return 200 "$(printf '%0100d' 0)"; } }
  server { listen 127.0.0.1:$2; location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection ""; } }
  $tls_server
  ${NGINX_EXTRA:-}
}
CONF
  nginx -c "$WORK/nginx.conf" -p "$WORK"
}

start_public_gateway() {  # proxy_port admin_port upstream_port [name [binary [extra yaml]]]: sessiongate with one public route; sets SG_PID
  local name=${4:-sessiongate} binary=${5:-$BIN}
  cat > "$WORK/$name.yaml" <<CONF
server:
  listen: "127.0.0.1:$1"
  admin_listen: "127.0.0.1:$2"
  access_log: off
routes:
  - name: bench
    upstream: "http://127.0.0.1:$3"
    auth: public
${6:-}
CONF
  "$binary" serve --config "$WORK/$name.yaml" > "$WORK/$name.log" 2>&1 &
  SG_PID=$!
  PIDS+=($SG_PID)
  for _ in $(seq 100); do grep -q "sessiongate listening" "$WORK/$name.log" && break; sleep 0.1; done
  grep -q "sessiongate listening" "$WORK/$name.log" || { cat "$WORK/$name.log"; exit 1; }
}

# Appends a run to bench/RESULTS.md: a dated heading (TITLE, then BENCH_NOTE), "Command: COMMAND",
# the table in $WORK/table.md, then each further argument as a line of its own.
record() {  # title command [line…]
  local title=$1 command=$2
  shift 2
  {
    echo
    echo "## $(date -u '+%Y-%m-%d %H:%M UTC') — $title${BENCH_NOTE:+; $BENCH_NOTE}"
    echo
    echo "Command: $command"
    echo
    cat "$WORK/table.md"
    if [ $# -gt 0 ]; then echo; printf '%s\n' "$@"; fi
  } >> bench/RESULTS.md
  echo "appended to bench/RESULTS.md"
}

# CPU seconds (user+system) a process has used so far.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{print ($14+$15)/hz}' "/proc/$1/stat"; }
