# spectune: make setup | make test | make demo
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test test-fast demo bench-landscapes bench-fleet-load clean

setup:
	scripts/setup.sh

# The engine tests and the engine-free ones at once, in two pytest processes (scripts/test.sh).
test: setup
	scripts/browser.sh
	PY=$(PY) scripts/test.sh

test-fast:
	$(PY) -m pytest -q -m "not engine"

demo: setup
	scripts/demo.sh

bench-landscapes: setup
	$(PY) benchmarks/landscapes.py

# 8 worker processes on a PostgreSQL study (the machine's server, a database of its own) and 4 on SQLite
bench-fleet-load: setup
	$(PY) benchmarks/fleet_load.py

clean:
	rm -rf storage/*.db storage/logs .pytest_cache
