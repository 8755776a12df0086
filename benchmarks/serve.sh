#!/bin/bash
# `kiln serve` under load on one GPU, from the repo root of the device machine:
#   PART=bf16,int4,generate bash benchmarks/serve.sh      # parts comma-separated, run in order
# The Llama-3.2-3B shape (MODEL names another preset), RANDOM weights (the shape is what is measured;
# the text is noise), prompts of PROMPT_LEN (512) random token ids, MAX_TOKENS (128) greedy tokens each, streamed.
#   bf16      kiln serve --max-batch 64 --batch-buckets 1,8,32,64 --max-seq-len MAX_SEQ_LEN (default 1024; the
#             triton attention reads only the slots a row uses, and fewer slots than 896 make the rows shift, a
#             copy of every busy row's span, every few joins: docs/guide/serve.md), warmed before it binds (every
#             decode bucket and the 512-token prompt bucket, the only one these prompts use); then
#             benchmarks/serve_load.py: closed loop at 1, 8, 32 and 64 concurrent streams (DURATION_S each,
#             default 20; each level warmed up first), then the open-loop sweep: Poisson arrivals at
#             OPEN_FRACTIONS (0.25,0.5,0.75,1,1.25,1.5) x the 32-stream level's requests/s, OPEN_S (10) s each,
#             stopping at the first rate whose p99 TTFT reaches 1 s -> $R/serve_bf16
#   int4      the same with --quant ${QUANT4:-int4@triton} -> $R/serve_int4
#   text      the real-text model served: MODEL_DIR (an exported model), or, when unset, benchmarks/llm_real_text.sh
#             run short first (TEXT_STEPS=800 steps capped at TEXT_TRAIN_S=150 s, SKIP_CHECK=1 SKIP_BENCH=1
#             SKIP_GENERATE=1; needs .data/realtext carried) and its export served; one chat request (then the plain completion when the
#             model has no chat template: the 400 is kept as chat.json) and /metrics -> $R/text (answer.json,
#             metrics.txt, server.log); PROMPT sets the question. Served eager (TEXT_COMPILE=off): no compile wait.
#             An export without a chat template gets a plain "Question: ... Answer:" one first ($R/text/chat_template.jinja).
#   generate  kiln bench llm --batch 1,8,32,64 --quant GEN_QUANT (default none,$QUANT4) (kiln generate's engine, one
#             static batch per row: the same figures without a server) -> $R/generate
# Then $R/summary.md: one table of every part run, and the server's inter-token p50 beside the engine's decode
# step at the same batch and the bandwidth roofline (needs PART=generate in the same $OUT). The server's log is
# $R/<part>.server.log, its /metrics after the load $R/<part>.metrics.txt. Each part is bounded by PART_S
# (default 470 s; its server may warm up for all of it but the load's share: 120 s, less for a few short levels); the whole call by BUDGET_S (default 570 s): run one part per device call when compiles are cold.
# Needs fastapi, uvicorn and httpx on the device: carry wheels in .whl/ (device_env.sh installs them).
# SERVE_FLAGS adds kiln serve flags to bf16/int4 (e.g. "--decode-attention matmul": it reads all MAX_SEQ_LEN
# slots of every row, where triton and flash read only the slots a row uses); TAG suffixes their labels (a second run, same $OUT).
# KILN_SETTINGS="MODULE.NAME=VALUE ..." runs bf16/int4/generate through benchmarks/with_settings.py, e.g.
# KILN_SETTINGS="kiln.kernels.triton_decode.BALANCE=True kiln.kernels.triton_decode.TARGET_PROGRAMS=512" TAG=bal.
# E.g. SERVE_FLAGS="--prefill-tokens 2048 --join-batch 4" TAG=p2048: up to four 512-token joins prefilled in one
# forward (each k is warmed too: 6 prefill variants of the 512 bucket instead of 2).
# TEMPERATURE (default 0: greedy) and TOP_P (default 1) set every request's sampling. CLIENT_PROCS (default 4):
# the load generator's processes for a closed-loop level's streams (one process at 32 streams used most of a core).
# CPU smoke test of the plumbing: DEVICE=cpu MODEL=llama-tiny VOCAB=512 MAX_SEQ_LEN=64 PROMPT_LEN=16 MAX_TOKENS=8
#   BATCH_BUCKETS=1,2,4 MAX_BATCH=4 CONCURRENCY=1,4 OPEN_BASE=4 WARMUP_BUCKETS=none PART=bf16 (text: DRY=1).
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
MAX_BATCH=${MAX_BATCH:-64}
BATCH_BUCKETS=${BATCH_BUCKETS:-1,8,32,64}
MAX_SEQ_LEN=${MAX_SEQ_LEN:-1024}
PROMPT_LEN=${PROMPT_LEN:-512}
MAX_TOKENS=${MAX_TOKENS:-128}
CONCURRENCY=${CONCURRENCY:-1,8,32,64}
WARMUP_BUCKETS=${WARMUP_BUCKETS:-512}  # none: --no-warmup
DEV=(); [ -n "${DEVICE:-}" ] && DEV=(--device "$DEVICE")
read -r -a EXTRA <<< "${SERVE_FLAGS:-}"  # more kiln serve flags for bf16/int4, e.g. "--decode-attention flash"
read -r -a SETTINGS <<< "${KILN_SETTINGS:-}"  # module settings for bf16/int4/generate (benchmarks/with_settings.py)
KILN=(python3 -m kiln); [ ${#SETTINGS[@]} -gt 0 ] && KILN=(python3 benchmarks/with_settings.py "${SETTINGS[@]}" --)
SUFFIX=${TAG:+_$TAG}  # labels (and result folders) of a second run in the same $OUT
WARM=(--warmup-prompt-buckets "$WARMUP_BUCKETS"); [ "$WARMUP_BUCKETS" = none ] && WARM=(--no-warmup)
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
pack() { tar czf "$OUT/serve.tgz" -C "$R" .; }

port_free() {  # another server on the port would be measured instead of ours
  ! curl -s "http://127.0.0.1:$PORT/health" >/dev/null || { echo "serve.sh: port $PORT is in use (PORT=...)" >&2; return 1; }
}

wait_health() {  # pid, log, seconds[, what to do when they run out]: 0 once /health answers 200
  local pid=$1 log=$2 cap=$3 hint=${4:-} t0=$(date +%s)
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    sleep 1
    kill -0 "$pid" 2>/dev/null || { echo "serve.sh: kiln serve exited; see $log" >&2; tail -5 "$log"; return 1; }
    [ $(( $(date +%s) - t0 )) -gt "$cap" ] && { echo "serve.sh: no /health after $cap s (warm-up: see $log)${hint:+; $hint}" >&2
      kill -TERM "$pid"; wait "$pid"; return 1; }
  done
  return 0
}

load_reserve() {  # seconds of a part kept for its load: 120, or less for a short one (few levels, no open loop)
  local levels fractions need
  levels=$(tr ',' '\n' <<< "$CONCURRENCY" | grep -c '[0-9]')
  fractions=$(tr ',' '\n' <<< "${OPEN_FRACTIONS:-0.25,0.5,0.75,1,1.25,1.5}" | grep -c '[0-9]')
  need=$(( levels * (${DURATION_S:-20} + 10) + fractions * (${OPEN_S:-10} + 5) + 25 ))
  echo $(( need < 120 ? need : 120 ))
}

serve_part() {  # label, quant, extra kiln serve flags...
  local label=$1 quant=$2; shift 2
  local cap=$(left); [ "$cap" -gt "$PART_S" ] && cap=$PART_S
  local t0=$(date +%s)
  port_free || return 1
  "${KILN[@]}" serve --model "$MODEL" --port "$PORT" --max-batch "$MAX_BATCH" --batch-buckets "$BATCH_BUCKETS" \
    --max-seq-len "$MAX_SEQ_LEN" "${WARM[@]}" --max-queue 64 --drain-s 5 "${DEV[@]}" "${EXTRA[@]}" "$@" \
    > "$R/$label.server.log" 2>&1 &
  local pid=$!
  wait_health $pid "$R/$label.server.log" $(( cap - $(load_reserve) )) \
    "the part's $cap s less the load's $(load_reserve) s is what warm-up gets: raise PART_S (and BUDGET_S)" || return 1
  local rest=$(( cap - ($(date +%s) - t0) - 15 ))
  step "load_$label" timeout "$rest" python3 benchmarks/serve_load.py --url "http://127.0.0.1:$PORT" --label "$label" \
    --quant "$quant" --concurrency "$CONCURRENCY" --prompt-len "$PROMPT_LEN" --max-tokens "$MAX_TOKENS" \
    --vocab "${VOCAB:-128256}" --temperature "${TEMPERATURE:-0}" --top-p "${TOP_P:-1}" \
    --duration-s "${DURATION_S:-20}" --procs "${CLIENT_PROCS:-4}" --open-fractions "${OPEN_FRACTIONS:-0.25,0.5,0.75,1,1.25,1.5}" \
    --open-base "${OPEN_BASE:-32}" --open-duration-s "${OPEN_S:-10}" --request-timeout-s 120 \
    --deadline-s "$(( rest - 10 ))" --out "$R/serve_$label"
  curl -s "http://127.0.0.1:$PORT/metrics" > "$R/$label.metrics.txt"
  kill -TERM $pid; wait $pid; echo "=== kiln serve ($label) exit $? after SIGTERM"
}

post() {  # route, JSON body -> stdout
  curl -s "http://127.0.0.1:$PORT/v1/$1" -H 'Content-Type: application/json' -d "$2"
}

serve_text() {
  local cap=$(left); [ "$cap" -gt "$PART_S" ] && cap=$PART_S
  local t0=$(date +%s) dir=${MODEL_DIR:-}
  mkdir -p "$R/text"
  if [ -z "$dir" ]; then  # the real-text recipe, short: train, export (with its tokenizer), generate
    local work=${TEXT_WORK:-/tmp/serve_text}
    [ "$cap" -ge 240 ] || { echo "serve.sh: PART=text trains a model first (~4 min): $cap s left; run it in a call" \
      "of its own, or set MODEL_DIR" >&2; return 1; }
    step text_recipe timeout -k 10 $(( cap - 90 )) env WORK="$work" STEPS="${TEXT_STEPS:-800}" \
      TRAIN_CAP_S="${TEXT_TRAIN_S:-150}" SKIP_CHECK=1 SKIP_BENCH=1 SKIP_GENERATE=1 bash benchmarks/llm_real_text.sh
    dir=$work/hf
    [ -f "$dir/config.json" ] || { echo "serve.sh: the real-text recipe exported no model ($dir); see" \
      "$R/text_recipe.log" >&2; return 1; }
  fi
  if ! grep -qs chat_template "$dir/tokenizer_config.json" && [ ! -f "$dir/chat_template.jinja" ]; then
    # A base model trained on documentation has no chat format: give it a plain question/answer one
    # (kept beside the answer), so the chat route is what is exercised.
    printf '%s' "{% for m in messages %}{% if m['role'] == 'user' %}Question: {{ m['content'] }}
{% elif m['role'] == 'assistant' %}Answer: {{ m['content'] }}
{% else %}{{ m['content'] }}

{% endif %}{% endfor %}{% if add_generation_prompt %}Answer:{% endif %}" > "$dir/chat_template.jinja"
    cp "$dir/chat_template.jinja" "$R/text/chat_template.jinja"
  fi
  port_free || return 1
  local flags=(--compile "${TEXT_COMPILE:-off}" --max-batch 4 --batch-buckets 1,4 --warmup-prompt-buckets 16,32,64,128)
  python3 -m kiln serve --model "$dir" --port "$PORT" "${flags[@]}" "${DEV[@]}" > "$R/text/server.log" 2>&1 &
  local pid=$!
  wait_health $pid "$R/text/server.log" $(( cap - ($(date +%s) - t0) - 30 )) || return 1
  local name q
  name=$(basename "$dir")
  q=${PROMPT:-How do I install a Python package?}
  printf '%s\n' "$q" > "$R/text/prompt.txt"
  body() {  # route -> its request body
    python3 -c 'import json, sys
key, text = ("messages", [{"role": "user", "content": sys.argv[3]}]) if sys.argv[1] == "chat" else ("prompt", sys.argv[3])
print(json.dumps({"model": sys.argv[2], key: text, "max_tokens": 64, "temperature": 0}))' "$1" "$name" "$q"
  }
  post chat/completions "$(body chat)" > "$R/text/answer.json"
  if grep -q no_chat_template "$R/text/answer.json"; then
    mv "$R/text/answer.json" "$R/text/chat.json"
    post completions "$(body completions)" > "$R/text/answer.json"
  fi
  cat "$R/text/answer.json"; echo
  curl -s "http://127.0.0.1:$PORT/metrics" > "$R/text/metrics.txt"
  kill -TERM $pid; wait $pid; echo "=== kiln serve (text) exit $? after SIGTERM"
}

for part in ${PART//,/ }; do
  case $part in
    text) serve_text ;;
    bf16) serve_part "bf16$SUFFIX" none ;;
    int4) serve_part "int4$SUFFIX" "$QUANT4" --quant "$QUANT4" ;;
    generate)
      cap=$(left); [ "$cap" -gt "$PART_S" ] && cap=$PART_S
      step generate timeout "$cap" "${KILN[@]}" bench llm --model "$MODEL" --prompt-len "$PROMPT_LEN" \
        --new-tokens "$MAX_TOKENS" --tuning decode --prefill eager --repeats 3 --engines kiln-compiled \
        --batch "$CONCURRENCY" --quant "${GEN_QUANT:-none,$QUANT4}" --deadline-s $(( cap * 2 / 3 )) "${DEV[@]}" --out "$R/generate" ;;
  esac
  python3 benchmarks/serve_load.py --summary "$R" > /dev/null
  pack
done
