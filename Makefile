# The two commands a newcomer needs: `make demo` (the main job) and `make test`.
.PHONY: setup demo serve test

setup:
	./scripts/setup.sh

demo: setup
	.venv/bin/blockq demo

serve: setup
	.venv/bin/blockq serve

test: setup
	.venv/bin/python -m pytest -q
