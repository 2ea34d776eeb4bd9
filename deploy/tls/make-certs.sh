#!/bin/sh
# Self-signed CA plus scheduler, worker and client certificates for a private Dask cluster.
#   deploy/tls/make-certs.sh [OUTDIR] [HOSTNAME...]
# OUTDIR defaults to ./tls-certs; the hostnames (default: scheduler localhost) go into the
# certificates' subjectAltName. Keys are written with mode 600 and must never be committed.
set -eu

OUT=${1:-./tls-certs}
[ "$#" -gt 0 ] && shift
HOSTS=${*:-scheduler localhost}
DAYS=${DAYS:-365}

mkdir -p "$OUT"
umask 077

SAN="IP:127.0.0.1"
for host in $HOSTS; do SAN="$SAN,DNS:$host"; done

openssl req -x509 -newkey rsa:3072 -nodes -days "$DAYS" -subj "/CN=kelr-dask-ca" \
    -keyout "$OUT/ca-key.pem" -out "$OUT/ca.pem"

for role in scheduler worker client; do
    openssl req -new -newkey rsa:3072 -nodes -subj "/CN=kelr-dask-$role" \
        -keyout "$OUT/$role-key.pem" -out "$OUT/$role.csr"
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$SAN" > "$OUT/$role.ext"
    openssl x509 -req -in "$OUT/$role.csr" -days "$DAYS" -CA "$OUT/ca.pem" -CAkey "$OUT/ca-key.pem" \
        -CAcreateserial -extfile "$OUT/$role.ext" -out "$OUT/$role.pem"
    rm -f "$OUT/$role.csr" "$OUT/$role.ext"
done
chmod 644 "$OUT"/*.pem
chmod 600 "$OUT"/*-key.pem
echo "certificates written to $OUT"
