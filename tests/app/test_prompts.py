"""The served model's tokenizer loads once per process, whatever the threads asking for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.environment import ROOT

#: A fresh process (transformers not imported yet) whose first 8 callers arrive at once.
FIRST_CALLERS_AT_ONCE = """
import sys, threading
from pathlib import Path
from domain.prompts import PromptCodec

barrier, errors = threading.Barrier(8), []

def count() -> None:
    barrier.wait()
    try:
        PromptCodec(Path(sys.argv[1])).count("hello there")
    except Exception as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=count) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(errors or "ok")
"""


@pytest.mark.slow  # three fresh processes import transformers: about 18 CPU-seconds
def test_concurrent_first_callers_all_get_the_tokenizer(model_path: Path) -> None:
    # NOTE: without the load lock, about every second process failed here (transformers'
    # lazy import is not thread-safe); three processes make a regression very likely to show.
    for _ in range(3):
        result = subprocess.run([sys.executable, "-c", FIRST_CALLERS_AT_ONCE, str(model_path)],
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "ok"
