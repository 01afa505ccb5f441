"""A worker that fails to build the app once does not take the API down.

gunicorn stops its master when a worker fails to boot (exit 3): one replacement worker that
met a bad second stopped the whole API in the hour-long soak. Here a real gunicorn runs the
API's worker class on an app whose first build raises.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

from app.api.gunicorn_worker import BOOT_RETRIES_S
from app.cli.stack import API_WORKER_CLASS, free_port
from tests.redis_server import eventually

ROOT = Path(__file__).resolve().parents[2]

#: An app whose first build fails; each later build succeeds.
FLAKY_APP = textwrap.dedent("""
    from pathlib import Path

    FAILED_ONCE = Path(__file__).with_name("failed-once")

    def create():
        if not FAILED_ONCE.exists():
            FAILED_ONCE.write_text("")
            raise RuntimeError("a transient failure while building the app")

        def app(environ, start_response):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"served"]
        return app
""")


def _served(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as answer:
            return answer.read() == b"served"
    except OSError:
        return False


def test_a_worker_whose_first_app_build_fails_tries_again_and_serves(tmp_path: Path) -> None:
    (tmp_path / "flaky_wsgi.py").write_text(FLAKY_APP)
    port = free_port()
    log = tmp_path / "gunicorn.log"
    with log.open("w") as out:
        master = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "--chdir", str(tmp_path),
             "--pythonpath", str(ROOT), "--bind", f"127.0.0.1:{port}", "--workers", "1",
             "--worker-class", API_WORKER_CLASS, "--no-control-socket", "flaky_wsgi:create()"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        served = eventually(lambda: _served(port) or master.poll() is not None,
                            timeout_s=60 + sum(BOOT_RETRIES_S))
        assert served and master.poll() is None, log.read_text()[-3000:]
        text = log.read_text()
        assert "a transient failure while building the app" in text  # the traceback is kept
        assert "building the app failed; trying again" in text
    finally:
        master.terminate()
        master.wait(timeout=30)
