#!/usr/bin/env bash
# The tests in two pytest processes at once: those that start real engines (-m engine, one
# engine at a time) and the engine-free ones, which use the cores while engines load. The tiny
# models are built once, in a folder both share (the build takes a file lock). Each prints its
# slowest tests; the exit status is the worse of the two. Arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
shared=$(mktemp -d -t spectune-tests.XXXXXX)
engines=
stop() {
  [ -n "$engines" ] && kill -- "$engines" 2>/dev/null && wait "$engines" 2>/dev/null
  rm -rf "$shared"
}
trap stop EXIT
trap 'exit 130' INT TERM
export SPECTUNE_TEST_MODELS=${SPECTUNE_TEST_MODELS:-$shared/tiny-models}
start=$(date +%s)
"$PY" -m pytest -q -m engine --durations=15 --basetemp="$shared/engine-tmp" "$@" >"$shared/engine.log" 2>&1 &
engines=$!
"$PY" -m pytest -q -m "not engine" --durations=15 --basetemp="$shared/free-tmp" "$@"
free=$?
wait "$engines"
engine=$?
engines=
# 5: no test selected in one of the halves (arguments that name engine-free tests only, say)
[ "$free" = 5 ] && free=0
[ "$engine" = 5 ] && engine=0
echo
echo "== tests that start engines (-m engine) =="
cat "$shared/engine.log"
echo "== both runs: $(( ($(date +%s) - start) / 60 )) min; engine-free exit $free, engines exit $engine =="
exit $(( free > engine ? free : engine ))
