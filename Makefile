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

# The 25 slowest steps and (tests/stack/conftest.py) every whole stack started are listed at the
# end: where a run's time went.
test: setup
	.venv/bin/python -m pytest -q --durations=25

# The inner loop while editing: everything but the vLLM, whole-stack and slow tests (under 2
# minutes), in 4 parallel workers (pytest-xdist), each on its own database and Redis db
# (tests/environment.py): more workers than cores, as many tests wait on PostgreSQL, Redis or
# a subprocess; a test file's tests in one worker (--dist loadfile), so that a file's costly
# imports and fixtures (vLLM, torch, a trained model) are paid once, not in every worker.
test-fast: setup
	.venv/bin/python -m pytest -q -n 4 --dist loadfile -m "not vllm and not stack and not slow"
