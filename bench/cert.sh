# Sourced by the TLS scripts before bench/lib.sh (nginx starts there with the certificate): a
# self-signed ECDSA P-256 certificate for localhost and 127.0.0.1 in CERT_DIR (cert.pem, key.pem).
# The caller removes CERT_DIR on exit.
CERT_DIR=$(mktemp -d /tmp/sessiongate-bench-cert.XXXXXX)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$CERT_DIR/key.pem" -out "$CERT_DIR/cert.pem" \
  -days 2 -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
