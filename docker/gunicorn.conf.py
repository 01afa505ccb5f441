"""Gunicorn settings of the API image, taken from blockq's Settings as the local stack does."""

from domain.settings import Settings

_settings = Settings.load()

bind = f"{_settings.api_host}:{_settings.api_port}"
workers = _settings.api_workers
# NOTE: gevent: each sync or streamed OpenAI completion holds a connection (a greenlet, no
# thread) while it waits; the API keeps api_reserved_connections of them for /healthz, /readyz
# and short calls (app/api/held_connections.py).
worker_class = "app.api.gunicorn_worker.OpenAIErrorsGeventWorker"  # OpenAI-format errors
worker_connections = _settings.api_connections
keepalive = _settings.api_keepalive_s
graceful_timeout = 10
# NOTE: no control socket (gunicorn 27 opens one at a fixed per-user path); blockq uses none.
control_socket_disable = True
# NOTE: the worker heartbeat file on tmpfs: a container's overlay filesystem can stall it.
worker_tmp_dir = "/dev/shm"
