# The two commands a newcomer needs: `make demo` (the main job) and `make test`.
.PHONY: setup demo serve test test-fast

setup:
	./scripts/setup.sh

demo: setup
	.venv/bin/blockq demo

serve: setup
	.venv/bin/blockq serve

# The 25 slowest steps and (tests/stack/conftest.py) every whole stack started are listed at the
# end: where a run's time went.
test: setup
	.venv/bin/python -m pytest -q --durations=25

# The inner loop while editing: everything but the vLLM, whole-stack and slow tests (under 2
# minutes).
test-fast: setup
	.venv/bin/python -m pytest -q -m "not vllm and not stack and not slow"
