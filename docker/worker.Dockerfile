# blockq Celery workers without an engine: predictor (the default command), router, health sweep,
# batches, webhooks, beat, the one-shot `blockq migrate`, and Flower. One image; compose gives each
# its command.
#   docker build -f docker/worker.Dockerfile -t blockq/worker .     (from the repository root)
# Settings come from the environment at run time (BLOCKQ_*, DATABASE_URL, REDIS_URL); nothing
# secret is built in.
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

# --- flower: the Celery monitor, an operator tool rather than a dependency of blockq ----------
FROM deps AS flower
ARG FLOWER_VERSION=2.2.0
RUN pip install "flower==$FLOWER_VERSION"

# --- runtime ----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    BLOCKQ_DATA_DIR=/var/lib/blockq \
    BLOCKQ_MODEL_PATH=/opt/blockq/models/tiny-llama
RUN groupadd --system --gid 10001 blockq \
    && useradd --system --uid 10001 --gid blockq --create-home --home-dir /home/blockq blockq \
    && install -d -o blockq -g blockq /var/lib/blockq
COPY --from=flower /opt/venv /opt/venv
COPY --from=model /opt/blockq/models /opt/blockq/models
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY migrations ./migrations
COPY workers ./workers
COPY domain ./domain
COPY app ./app
COPY docker/healthcheck.py ./docker/
RUN python -m compileall -q app workers docker
USER blockq
# Healthy while a Celery worker of this container answers a ping; compose replaces the check
# for beat, Flower and migrate, which are no workers.
HEALTHCHECK --interval=30s --timeout=15s --start-period=60s --retries=3 \
    CMD ["python", "/app/docker/healthcheck.py", "worker"]
CMD ["celery", "-A", "workers", "worker", "-Q", "predict,learn", "-n", "predict@%h", \
     "--pool", "threads", "--concurrency", "16", "-l", "INFO", "--without-gossip", "--without-mingle"]
