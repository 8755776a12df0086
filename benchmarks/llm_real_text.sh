#!/bin/bash
# From real text to a served, quantized model on one GPU: train a ~88M-parameter Llama (kiln's own decoder,
# model.name=llama:CONFIG) on a prepared corpus with validation, export it as a Hugging Face directory with
# its tokenizer, generate from it, check transformers against kiln on it, then `kiln bench llm` with
# bf16 / int8 / int4 / int4@triton rows and perplexity on the validation text.
#   bash benchmarks/llm_real_text_data.sh    # once, on a machine with Debian's archive: writes .data/realtext/
#   bash benchmarks/llm_real_text.sh         # on the GPU machine, .data/ carried; ~6-8.5 minutes on one H100
# Model: hidden 768, 12 layers, 12 query / 4 key-value heads, MLP 2048, vocab from meta.json (16384),
# tied embeddings, 1024 positions. Training: 32 x 1024 tokens per step, STEPS (default 1000, ~4 epochs of
# the ~8M-token corpus), AdamW lr 1e-3 (100 warm-up steps, cosine to 1e-4), weight decay 0.1, bf16-mixed,
# compiled; validation every 100 steps on 2 batches (64 windows, 65,536 tokens) of val.bin; checkpoints every 250 steps (and one on the
# SIGTERM of its time cap), so a training cut short still exports.
# Writes under $OUT/r/llm_real_text/: summary.json (every figure below), train.log, metrics.jsonl, report.md
# (kiln report of the run), generate.log, bench.json (kiln bench llm's results), bench.log; $OUT/r/nvidia-smi.csv.
# Time: training is capped at TRAIN_CAP_S (300 s); the bench gets what is left of TOTAL_S (510 s) and starts no
# row in its last 100 s (a skipped row says so), so the script ends inside ~9 minutes.
# SKIP_CHECK=1 / SKIP_BENCH=1 leave out the transformers check / the bench (a short train + export + generate);
# SKIP_GENERATE=1 the generate step too (benchmarks/serve.sh's text part: the server generates).
# DRY=1: the same steps on the CPU with a tiny model and a few steps (~2-3 minutes), for testing the script.
set -uo pipefail
source benchmarks/device_env.sh 2>/dev/null  # $OUT/r as $R, carried wheels, PYTHONPATH, nvidia-smi.csv
R=$R/llm_real_text
mkdir -p "$R"
DATA=${DATA:-.data/realtext}
WORK=${WORK:-/tmp/llm_real_text}
STEPS=${STEPS:-1000}
TRAIN_CAP_S=${TRAIN_CAP_S:-300}
TOTAL_S=${TOTAL_S:-510}  # the whole script; the bench gets what is left
PY=${PYTHON:-python3}
t0=$(date +%s)
say() { echo "=== $* ($(date +%T), +$(( $(date +%s) - t0 )) s)"; }
if [ ! -f "$DATA/meta.json" ]; then
  echo "$DATA/meta.json missing: run benchmarks/llm_real_text_data.sh and carry .data/" >&2; exit 2
fi
rm -rf "$WORK"; mkdir -p "$WORK"
SIZE=(768 12 12 4 2048 1024) BATCH=32 SEQ=1024 EVAL_STEPS=2 TRAIN=(precision.policy=bf16-mixed compile.enabled=true)
DEV=() BENCH=(--quant none,int8,int4,int4@triton --engines kiln-compiled --prefill eager --tuning decode)
PPL_TOKENS=32768 CHECK_TOKENS=65536
EVAL_INTERVAL=100 CKPT=250 WARMUP=100
if [ "${DRY:-0}" = 1 ]; then
  SIZE=(64 2 4 2 128 256) BATCH=4 SEQ=64 EVAL_STEPS=2 STEPS=${DRY_STEPS:-12} EVAL_INTERVAL=6 CKPT=6 WARMUP=2
  TRAIN=(training.device=cpu data.num_workers=0) DEV=(--device cpu)
  BENCH=(--quant none,int8@torch,int4@inductor --group-size 32 --engines kiln-eager --device cpu) PPL_TOKENS=2048
  CHECK_TOKENS=2048
fi

say "model config"
"$PY" - "$DATA/meta.json" "$WORK/config.json" "${SIZE[@]}" <<'EOF'
import json, sys
meta = json.load(open(sys.argv[1]))
hidden, layers, heads, kv, ffn, positions = map(int, sys.argv[3:9])
eos = meta["eos_token_id"]
config = {"model_type": "llama", "vocab_size": meta["vocab_size"], "hidden_size": hidden, "intermediate_size": ffn,
          "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
          "max_position_embeddings": positions, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "tie_word_embeddings": True, "bos_token_id": eos, "eos_token_id": eos, "hidden_act": "silu"}
json.dump(config, open(sys.argv[2], "w"), indent=2)
embed = meta["vocab_size"] * hidden
layer = hidden * (heads * hidden // heads) * 2 + 2 * hidden * kv * (hidden // heads) + 3 * hidden * ffn + 2 * hidden
print(f"vocab {meta['vocab_size']}, {meta['splits']['train']['tokens']:,} train / "
      f"{meta['splits']['val']['tokens']:,} val tokens; ~{(embed + layers * layer + hidden) / 1e6:.1f}M parameters")
EOF

say "train $STEPS steps (cap $TRAIN_CAP_S s)"
RUN=$WORK/run
timeout -k 10 "$TRAIN_CAP_S" "$PY" -m kiln train "model.name=llama:$WORK/config.json" data.source=tokens \
  "data.path=$DATA" "data.seq_len=$SEQ" "data.batch_size=$BATCH" "training.steps=$STEPS" \
  "training.eval_interval=$EVAL_INTERVAL" "training.eval_steps=$EVAL_STEPS" training.log_interval=20 \
  optim.lr=1e-3 "optim.warmup_steps=$WARMUP" optim.weight_decay=0.1 optim.betas=[0.9,0.95] \
  "checkpoint.interval=$CKPT" metrics.console=false metrics.tensorboard=auto "${TRAIN[@]}" \
  --run-dir "$RUN" > "$R/train.log" 2>&1
rc=$?
# 124: the cap's SIGTERM came; the run may still have completed (the cap also counts start-up and teardown).
status=$("$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); print(s.get('status'), s.get('steps'), 'steps')" \
  "$RUN/summary.json" 2>/dev/null || echo "no summary")
echo "train exit $rc (run: $status)"; tail -5 "$R/train.log"
cp "$RUN/metrics.jsonl" "$R/metrics.jsonl" 2>/dev/null
"$PY" -m kiln report "$RUN" > /dev/null 2>&1 && cp "$RUN/report.md" "$R/report.md"

say "export"
"$PY" -m kiln export "$RUN" --out "$WORK/hf" 2>&1 | tail -3
ls "$WORK/hf" 2>/dev/null

if [ "${SKIP_GENERATE:-0}" != 1 ]; then
  say "generate"
  PROMPTS=("The kernel" "To install a package," "Python is")
  GEN_ARGS=()
  for p in "${PROMPTS[@]}"; do GEN_ARGS+=(--prompt "$p"); done
  "$PY" -m kiln generate --model "$WORK/hf" "${GEN_ARGS[@]}" --max-new-tokens 120 --temperature 0.8 --top-k 50 \
    --seed 0 --ignore-eos "${DEV[@]}" --json "$WORK/generate.json" > "$R/generate.log" 2>&1
  echo "generate exit $?"; tail -30 "$R/generate.log"
fi

if [ "${SKIP_CHECK:-0}" != 1 ]; then
  say "transformers vs kiln on the export"
  "$PY" benchmarks/llm_real_text_check.py "$WORK/hf" "$DATA" --out "$WORK/check.json" --tokens "$CHECK_TOKENS" \
    ${DEV:+--device cpu} 2>&1 | grep -v Warning | tail -12
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  left=$(( TOTAL_S - ($(date +%s) - t0) ))
  [ "$left" -lt 120 ] && left=120
  say "bench llm ($left s left: no row starts after $(( left - 100 )) s)"
  rm -rf "$WORK/bench"
  timeout -k 10 "$left" "$PY" -m kiln bench llm --model "$WORK/hf" "${BENCH[@]}" --ppl-file "$DATA" \
    --ppl-tokens "$PPL_TOKENS" --ppl-context "$SEQ" --prompt-len 128 --new-tokens 128 --repeats 3 --warmup 1 \
    --deadline-s "$(( left - 100 ))" --out "$WORK/bench" > "$R/bench.log" 2>&1
  echo "bench exit $?"; tail -5 "$R/bench.log"
  cp "$WORK/bench/results.json" "$R/bench.json" 2>/dev/null
fi

say "summary"
"$PY" - "$DATA" "$RUN" "$WORK" "$R/summary.json" <<'EOF'
import json, math, sys
from pathlib import Path
data, run, work, out = map(Path, sys.argv[1:5])
load = lambda p: json.loads(p.read_text()) if p.is_file() else None
meta, summary, check = load(data / "meta.json"), load(run / "summary.json"), load(work / "check.json")
generate, bench = load(work / "generate.json"), load(work / "bench" / "results.json")
records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()] if (run / "metrics.jsonl").is_file() else []
evals = [{"step": r["step"], "eval_loss": r["eval_loss"], "eval_perplexity": r.get("eval_perplexity")}
         for r in records if "eval_loss" in r]
result = {"corpus": {k: meta.get(k) for k in ("note", "tokens", "documents", "text_bytes", "vocab_size", "dtype",
                                               "splits", "unigram_val_perplexity")},
          "config": load(work / "config.json"),
          "train": {k: (summary or {}).get(k) for k in ("status", "steps", "num_params", "wall_s", "tokens_per_s", "mfu",
                                                        "first_loss", "final_loss", "eval_loss", "eval_perplexity",
                                                        "device_name", "precision", "torch")},
          "validation": evals, "generate": generate, "check": check,
          "bench": [{k: r.get(k) for k in ("quant", "engine", "status", "reason", "decode_tok_s", "ppl", "ppl_ratio",
                                           "ppl_bound", "ppl_judged", "drift_kl", "drift_bound", "drift_ok",
                                           "drift_top1", "weight_bytes")} for r in (bench or {}).get("results", [])]}
json.dump(result, open(out, "w"), indent=2, default=str)
unigram = (check or {}).get("unigram_val_ppl") or meta.get("unigram_val_perplexity")
print(f"corpus: {meta.get('note')}")
print(f"train: {result['train']['status']} {result['train']['steps']} steps, {result['train']['num_params']} params, "
      f"{result['train']['wall_s']} s, final loss {result['train']['final_loss']}")
for e in evals:
    print(f"  step {e['step']:>5}: val loss {e['eval_loss']:.4f}  val ppl {e['eval_perplexity']:.2f}")
print(f"validation perplexity (kiln bf16, export): {(check or {}).get('val_ppl_kiln_bf16')}; "
      f"transformers fp32: {(check or {}).get('val_ppl_hf_fp32')}; unigram baseline: {unigram}")
logits = (check or {}).get("logits_real_text") or {}
print(f"logits kiln vs transformers: fp32 ok {logits.get('ok_fp32')}, bf16 ok {logits.get('ok_bf16')}; "
      f"parity ok {((check or {}).get('parity') or {}).get('ok')}")
for row in result["bench"]:
    print(f"  bench {row['quant']:>12} {row['status']:>14} decode {row['decode_tok_s'] or 0:8.1f} tok/s  "
          f"ppl {row['ppl'] or float('nan'):8.3f} ratio {row['ppl_ratio'] or float('nan'):.4f}  "
          f"drift KL {row['drift_kl'] if row['drift_kl'] is not None else '-'}")
for prompt, text in zip((generate or {}).get("prompts") or [], (generate or {}).get("text") or []):
    print(f"--- sample:\n{prompt}{text}")
EOF
say "done"
