#!/usr/bin/env bash
# A throwaway CA and a server certificate for 127.0.0.1 / localhost, for tests of TLS to test
# servers (Qdrant over https, Kafka over SSL, Bolt over bolt+s):
#
#   scripts/test-ca.sh DIR     writes DIR/ca.pem, DIR/server.pem (leaf + CA chain), DIR/server.key
#
# Keys are EC P-256, valid one day; never use them for anything but a test.
set -euo pipefail
dir="${1:?usage: test-ca.sh DIR}"
mkdir -p "$dir"
cd "$dir"
openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
openssl req -x509 -new -key ca.key -sha256 -days 1 -subj "/CN=recollect test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout -out server.ec.key 2>/dev/null
# PKCS#8: what every server here reads (rustls-based ones refuse SEC1 keys in some versions).
openssl pkcs8 -topk8 -nocrypt -in server.ec.key -out server.key
rm -f server.ec.key
openssl req -new -key server.key -subj "/CN=localhost" -out server.csr 2>/dev/null
cat >server.ext <<'EXT'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost
EXT
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -sha256 \
  -extfile server.ext -out server.leaf.pem 2>/dev/null
cat server.leaf.pem ca.pem >server.pem
rm -f server.csr server.ext server.leaf.pem ca.srl
echo "test-ca: $dir/ca.pem, $dir/server.pem, $dir/server.key"
