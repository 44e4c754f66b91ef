#!/usr/bin/env bash
# generate_stream through the shim, in the format of the generate_stream spec (SSE lines "data:{...}").
# Usage: client/generate_stream.sh ["prompt"] [model] [shim url]
set -euo pipefail
prompt=${1:-My name is Olivier and I}
model=${2:-SmolLM2-135M-Instruct}
url=${3:-http://127.0.0.1:9000}
body=$(python3 -c 'import json,sys; print(json.dumps({"id": "a123", "text_input": sys.argv[1],
  "parameters": {"details": True, "do_sample": True, "max_new_tokens": 20, "seed": 123,
                 "temperature": 1, "top_k": 10, "top_p": 0.99}}))' "$prompt")
curl -sN -X POST "$url/v2/models/$model/generate_stream" -d "$body"
