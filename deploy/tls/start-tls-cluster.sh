#!/bin/sh
# A TLS-only scheduler and worker with explicit flags, then a kelr run against them.
#   deploy/tls/make-certs.sh /etc/kelr/tls scheduler localhost
#   DASK_CONFIG=deploy/tls deploy/tls/start-tls-cluster.sh STORE OUT
# The client side (kelr) takes its certificate from dask-tls.yaml (DASK_CONFIG).
set -eu

STORE=${1:?usage: start-tls-cluster.sh STORE OUT}
OUT=${2:?usage: start-tls-cluster.sh STORE OUT}
CERTS=${CERTS:-/etc/kelr/tls}

dask scheduler --host tls://0.0.0.0 --port 8786 \
    --tls-ca-file "$CERTS/ca.pem" --tls-cert "$CERTS/scheduler.pem" --tls-key "$CERTS/scheduler-key.pem" &
SCHEDULER_PID=$!
MALLOC_ARENA_MAX=1 dask worker tls://localhost:8786 --nthreads 1 --memory-limit 2GiB \
    --tls-ca-file "$CERTS/ca.pem" --tls-cert "$CERTS/worker.pem" --tls-key "$CERTS/worker-key.pem" &
WORKER_PID=$!
trap 'kill "$WORKER_PID" "$SCHEDULER_PID"' EXIT

kelr estimate "$STORE" "$OUT" --scheduler tls://localhost:8786
