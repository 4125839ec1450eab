"""spectune: find the speculative-decoding configuration that serves your model fastest on vLLM."""
