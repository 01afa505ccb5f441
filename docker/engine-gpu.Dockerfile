# blockq engine worker on one NVIDIA GPU: the vllm package (blockq's `gpu` extra) in the worker
# process, consuming one queue, gpu.<k>, named by ENGINE_QUEUE (unique across the fleet).
#   docker build -f docker/engine-gpu.Dockerfile -t blockq/engine-gpu .
# Run it with one GPU (compose: a device reservation; docker run: --gpus '"device=N"').
# Settings come from the environment at run time; nothing secret is built in.
# NOTE: the CUDA major of CUDA_IMAGE follows the torch build that the pinned vllm requires
# (CUDA 13 for vllm 0.32); the host's NVIDIA driver must support it. Change both together.
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04

# --- base: Python and what Triton needs at run time (a C compiler, Python headers) -----------
FROM ${CUDA_IMAGE} AS base
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates gcc libc6-dev python3 python3-dev python3-venv \
    && rm -rf /var/lib/apt/lists/*

# --- deps: a virtualenv with blockq[gpu] (vllm and its CUDA torch) ----------------------------
FROM base AS deps
ARG VLLM_VERSION=0.32.0
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv
WORKDIR /app
COPY pyproject.toml README.md ./
# NOTE: an editable install over empty package stubs: this layer is rebuilt only when
# pyproject.toml changes, and the runtime stage puts the real sources where it points (/app).
RUN mkdir app domain workers benchmarks \
    && touch app/__init__.py domain/__init__.py workers/__init__.py benchmarks/__init__.py \
    && pip install -e ".[gpu]" "vllm==$VLLM_VERSION"

# --- model: the tiny random-weight test model (a few MB), for smoke tests ---------------------
FROM deps AS model
COPY app/demo/sample_prompts.jsonl app/demo/
COPY benchmarks ./benchmarks
COPY scripts/build_tiny_model.py scripts/
RUN python scripts/build_tiny_model.py --out /opt/blockq/models/tiny-llama

# --- runtime ----------------------------------------------------------------------------------
FROM base AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    BLOCKQ_DATA_DIR=/var/lib/blockq \
    BLOCKQ_MODEL_PATH=/opt/blockq/models/tiny-llama \
    BLOCKQ_ENGINE_KIND=vllm
RUN groupadd --system --gid 10001 blockq \
    && useradd --system --uid 10001 --gid blockq --create-home --home-dir /home/blockq blockq \
    && install -d -o blockq -g blockq /var/lib/blockq
COPY --from=deps /opt/venv /opt/venv
COPY --from=model /opt/blockq/models /opt/blockq/models
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY migrations ./migrations
COPY workers ./workers
COPY domain ./domain
COPY app ./app
COPY docker/healthcheck.py docker/engine-worker.sh ./docker/
RUN python -m compileall -q app workers docker
USER blockq
# The worker answers pings only once its engine is up (it builds it before consuming); loading
# a large model and capturing CUDA graphs can take minutes.
HEALTHCHECK --interval=30s --timeout=15s --start-period=600s --retries=3 \
    CMD ["python", "/app/docker/healthcheck.py", "worker"]
ENTRYPOINT ["sh", "/app/docker/engine-worker.sh"]
