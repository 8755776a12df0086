#!/bin/bash
# `kiln serve` under load on one GPU, from the repo root of the device machine:
#   PART=bf16,int4,generate bash benchmarks/serve.sh      # parts comma-separated, run in order
# The Llama-3.2-3B shape (MODEL names another preset), RANDOM weights (the shape is what is measured;
# the text is noise), prompts of 512 random token ids, 128 greedy tokens each, streamed.
#   bf16      kiln serve --max-batch 64 --batch-buckets 1,8,32,64 (warmed before it binds: every decode bucket and
#             the 512-token prompt bucket, the only one these prompts use), then benchmarks/serve_load.py at 1, 8, 32
#             and 64 concurrent streams (DURATION_S each, default 20; each level warmed up first) -> $R/serve_bf16
#   int4      the same with --quant ${QUANT4:-int4@triton} -> $R/serve_int4
#   text      MODEL_DIR (an exported model, e.g. llm_real_text.sh's $WORK/hf) served; one chat request (a plain
#             completion when the model has no chat template: 400 no_chat_template first) and /metrics
#             -> $R/text (answer.json, metrics.txt, server.log); PROMPT sets the question
#   generate  kiln bench llm --batch 1,8,32,64 --quant none,$QUANT4 (kiln generate's engine, one static batch per
#             row: the same figures without a server) -> $R/generate
# Then $R/summary.md: one table of every part run. The server's log is $R/<part>.server.log, its
# /metrics after the load $R/<part>.metrics.txt. Each part is bounded by PART_S (default 470 s);
# the whole call by BUDGET_S (default 570 s): run one part per device call when compiles are cold.
# Needs fastapi, uvicorn and httpx on the device: carry wheels in .whl/ (device_env.sh installs them).
set -uo pipefail
VALID="bf16 int4 text generate"
[ -n "${PART:-}" ] || { echo "serve.sh: PART is required (${VALID// /, })" >&2; exit 2; }
for part in ${PART//,/ }; do
  [[ " $VALID " == *" $part "* ]] || { echo "serve.sh: unknown PART '$part' (${VALID// /, })" >&2; exit 2; }
done
source benchmarks/device_env.sh
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1
if ! python3 -c "import fastapi, uvicorn, httpx" 2>/dev/null; then
  echo "serve.sh: fastapi, uvicorn and httpx are missing: carry their wheels in .whl/ (pip download -d .whl" \
       "fastapi uvicorn httpx --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64)" >&2
  exit 2
fi
BUDGET_S=${BUDGET_S:-570}
PART_S=${PART_S:-470}
MODEL=${MODEL:-llama-3.2-3b}
QUANT4=${QUANT4:-int4@triton}
PORT=${PORT:-8011}
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
pack() { tar czf "$OUT/serve.tgz" -C "$R" .; }

serve_part() {  # label, extra kiln serve flags...
  local label=$1; shift
  local cap=$(left); [ "$cap" -gt "$PART_S" ] && cap=$PART_S
  local t0=$(date +%s)
  python3 -m kiln serve --model "$MODEL" --port "$PORT" --max-batch 64 --batch-buckets 1,8,32,64 --max-seq-len 1024 \
    --warmup-prompt-buckets 512 --max-queue 64 --drain-s 5 "$@" > "$R/$label.server.log" 2>&1 &
  local pid=$!
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    sleep 1
    kill -0 $pid 2>/dev/null || { echo "serve.sh: kiln serve exited; see $R/$label.server.log" >&2; tail -5 "$R/$label.server.log"; return 1; }
    [ $(( $(date +%s) - t0 )) -gt $(( cap - 120 )) ] && { echo "serve.sh: no /health after $(( cap - 120 )) s (warm-up: see" \
      "$R/$label.server.log)" >&2; kill -TERM $pid; return 1; }
  done
  local rest=$(( cap - ($(date +%s) - t0) - 15 ))
  step "load_$label" timeout "$rest" python3 benchmarks/serve_load.py --url "http://127.0.0.1:$PORT" --label "$label" \
    --duration-s "${DURATION_S:-20}" --out "$R/serve_$label"
  curl -s "http://127.0.0.1:$PORT/metrics" > "$R/$label.metrics.txt"
  kill -TERM $pid; wait $pid; echo "=== kiln serve ($label) exit $? after SIGTERM"
}

serve_text() {
  [ -n "${MODEL_DIR:-}" ] || { echo "serve.sh: PART=text needs MODEL_DIR (an exported model directory)" >&2; return 1; }
  mkdir -p "$R/text"
  python3 -m kiln serve --model "$MODEL_DIR" --port "$PORT" --max-batch 4 > "$R/text/server.log" 2>&1 &
  local pid=$! t0=$(date +%s) name
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    sleep 1
    kill -0 $pid 2>/dev/null || { echo "serve.sh: kiln serve exited; see $R/text/server.log" >&2; return 1; }
    [ $(( $(date +%s) - t0 )) -gt 450 ] && { kill -TERM $pid; return 1; }  # warm-up compiles every bucket
  done
  name=$(basename "$MODEL_DIR")
  local q=${PROMPT:-What is a kiln?}
  curl -s "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$(python3 -c 'import json,sys; print(json.dumps({"model": sys.argv[1], "messages": [{"role": "user", "content": sys.argv[2]}], "max_tokens": 64, "temperature": 0}))' "$name" "$q")" > "$R/text/answer.json"
  if grep -q no_chat_template "$R/text/answer.json"; then
    curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' -d "$(python3 -c 'import json,sys; print(json.dumps({"model": sys.argv[1], "prompt": sys.argv[2], "max_tokens": 64, "temperature": 0}))' "$name" "$q")" > "$R/text/answer.json"
  fi
  cat "$R/text/answer.json"; echo
  curl -s "http://127.0.0.1:$PORT/metrics" > "$R/text/metrics.txt"
  kill -TERM $pid; wait $pid; echo "=== kiln serve (text) exit $? after SIGTERM"
}

for part in ${PART//,/ }; do
  case $part in
    text) serve_text ;;
    bf16) serve_part bf16 ;;
    int4) serve_part int4 --quant "$QUANT4" ;;
    generate)
      cap=$(left); [ "$cap" -gt "$PART_S" ] && cap=$PART_S
      step generate timeout "$cap" python3 -m kiln bench llm --model "$MODEL" --prompt-len 512 --new-tokens 128 \
        --tuning decode --prefill eager --repeats 3 --engines kiln-compiled --batch 1,8,32,64 --quant "none,$QUANT4" \
        --deadline-s $(( cap * 2 / 3 )) --out "$R/generate" ;;
  esac
  python3 benchmarks/serve_load.py --summary "$R" > /dev/null
  pack
done
