.PHONY: bench test

# The benchmark of bench/README.md: the generated trainer against hand-written DDP, Accelerate, Fabric.
bench:
	python -m bench

# The test suite, as CI runs it.
test:
	python -m pytest -q -n 2
