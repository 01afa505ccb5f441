#!/bin/sh
# Engine worker of one instance: the queue gpu.<k> named by ENGINE_QUEUE, unique across the
# fleet, is also the instance id. The engine lives in this process and every task thread feeds
# it, so the pool is threads and the concurrency (BLOCKQ_ENGINE_CONCURRENCY) is at least
# BLOCKQ_MAX_BATCH_IN_FLIGHT + BLOCKQ_MAX_NUM_SEQS (the settings refuse less). Arguments are
# passed on to the Celery worker.
set -eu
case "${ENGINE_QUEUE:-}" in
    gpu.?*) ;;
    *)
        echo "ENGINE_QUEUE must name this instance's queue, gpu.<k>; got '${ENGINE_QUEUE:-}'" >&2
        exit 64
        ;;
esac
exec celery -A workers worker -Q "$ENGINE_QUEUE" -n "$ENGINE_QUEUE@%h" --pool threads \
    --concurrency "${BLOCKQ_ENGINE_CONCURRENCY:-384}" -l "${BLOCKQ_LOG_LEVEL:-INFO}" \
    --without-gossip --without-mingle "$@"
