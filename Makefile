# The two commands a newcomer needs: `make demo` (the main job) and `make test`.
.PHONY: setup demo serve test test-fast

setup:
	./scripts/setup.sh

# The local stack serves the two tiny test models side by side, each on its own vLLM engine
# (BLOCKQ_FLEET in the environment overrides it).
demo serve: export BLOCKQ_FLEET ?= [{"model": "tiny-llama"}, {"model": "tiny-qwen"}]

demo: setup
	.venv/bin/blockq demo

serve: setup
	.venv/bin/blockq serve

# The tests write Python's bytecode caches (__pycache__/, git-ignored) even where the environment
# sets PYTHONDONTWRITEBYTECODE (an empty value turns it off): otherwise every test process and
# every process a test starts compiles blockq and its ~460 test modules again (about 8 CPU-seconds
# a process; a third of `make test-fast`'s start-up).
test test-fast: export PYTHONDONTWRITEBYTECODE =

# The 25 slowest steps and (tests/stack/conftest.py) every whole stack started are listed at the
# end: where a run's time went.
test: setup
	.venv/bin/python -m pytest -q --durations=25

# The inner loop while editing: everything but the vLLM, whole-stack and slow tests (under 2
# minutes), in 3 parallel workers (pytest-xdist), each on its own database and Redis db
# (tests/environment.py): one more worker than cores, as some tests wait on PostgreSQL, Redis or
# a subprocess, but no more, as each worker pays its own collection and first tokenizer load
# (about 15 CPU-seconds; 4 workers took 112 s where 3 took 104 s); a test file's tests in one
# worker (--dist loadfile), so that a file's costly imports and fixtures (torch, a trained
# model) are paid once, not in every worker.
test-fast: setup
	.venv/bin/python -m pytest -q -n 3 --dist loadfile -m "not vllm and not stack and not slow"
