# blockq engine worker hosting an emulated GPU (BLOCKQ_ENGINE_KIND=emulated): the vLLM
# scheduling model run in real or scaled time, for trying blockq and load tests without GPUs.
# It consumes one queue, gpu.<k>, named by ENGINE_QUEUE (unique across the fleet).
#   docker build -f docker/engine-emulated.Dockerfile -t blockq/engine-emulated .
# Settings come from the environment at run time; nothing secret is built in.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- deps: a virtualenv with blockq's dependencies (same stage in every CPU image) ------------
FROM ${PYTHON_IMAGE} AS deps
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv
# NOTE: torch from its CPU index first: the PyPI build adds gigabytes of CUDA libraries that the
# tokenizer and the length model's encoder never use.
RUN pip install --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"
WORKDIR /app
COPY pyproject.toml README.md ./
# NOTE: an editable install over empty package stubs: this layer is rebuilt only when
# pyproject.toml changes, and the runtime stage puts the real sources where it points (/app).
RUN mkdir app domain workers benchmarks \
    && touch app/__init__.py domain/__init__.py workers/__init__.py benchmarks/__init__.py && pip install -e .

# --- model: the tiny random-weight test model (a few MB) --------------------------------------
FROM deps AS model
COPY app/demo/sample_prompts.jsonl app/demo/
COPY benchmarks ./benchmarks
COPY scripts/build_tiny_model.py scripts/
RUN python scripts/build_tiny_model.py --out /opt/blockq/models/tiny-llama

# --- runtime ----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    BLOCKQ_DATA_DIR=/var/lib/blockq \
    BLOCKQ_MODEL_PATH=/opt/blockq/models/tiny-llama \
    BLOCKQ_ENGINE_KIND=emulated
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
# The worker answers pings only once its engine is up: it builds it before consuming.
HEALTHCHECK --interval=30s --timeout=15s --start-period=120s --retries=3 \
    CMD ["python", "/app/docker/healthcheck.py", "worker"]
ENTRYPOINT ["sh", "/app/docker/engine-worker.sh"]
