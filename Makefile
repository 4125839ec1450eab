# spectune: make setup | make test | make demo
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-fast demo bench-landscapes clean

setup:
	scripts/setup.sh

test: setup
	scripts/browser.sh
	$(PY) -m pytest -q

test-fast:
	$(PY) -m pytest -q -m "not engine"

demo: setup
	scripts/demo.sh

bench-landscapes: setup
	$(PY) benchmarks/landscapes.py

clean:
	rm -rf storage/*.db storage/logs .pytest_cache
