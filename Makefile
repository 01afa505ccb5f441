# The two commands a newcomer needs: `make demo` (the main job) and `make test`.
.PHONY: setup demo serve test test-fast

setup:
	./scripts/setup.sh

demo: setup
	.venv/bin/blockq demo

serve: setup
	.venv/bin/blockq serve

test: setup
	.venv/bin/python -m pytest -q

# The inner loop while editing: everything but the vLLM, whole-stack and slow tests (under 2
# minutes).
test-fast: setup
	.venv/bin/python -m pytest -q -m "not vllm and not stack and not slow"
