# Sourced by the TLS scripts before bench/lib.sh (nginx starts there with the certificate): a
# self-signed ECDSA P-256 certificate for localhost and 127.0.0.1 in CERT_DIR (cert.pem, key.pem),
# and NGINX_TLS_ARGS for nginx's TLS server on NGINX_TLS (with HTTP/2 when NGINX_TLS_H2=h2).
# Removed at exit: here until bench/common.sh's cleanup takes over.
CERT_DIR=$(mktemp -d /tmp/sessiongate-bench-cert.XXXXXX)
trap 'rm -rf "$CERT_DIR"' EXIT
NGINX_TLS_ARGS="$NGINX_TLS $CERT_DIR/cert.pem $CERT_DIR/key.pem ${NGINX_TLS_H2:-}"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$CERT_DIR/key.pem" -out "$CERT_DIR/cert.pem" \
  -days 2 -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
