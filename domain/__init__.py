"""blockq's shared domain: what the HTTP API, the CLI and the Celery workers all use.

Settings (the one reader of the environment), the SQLAlchemy models and request store, the
outbox, the fleet's live state in Redis, queues and task names (`dispatch`), teams and keys,
files and batches, metrics and logs. No Flask here (import-linter's "domain-not-http"): a
worker that imports the domain loads no HTTP layer. The HTTP layer and the CLI live in `app/`.
"""
