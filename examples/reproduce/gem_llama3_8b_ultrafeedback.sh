#!/usr/bin/env bash
# GEM paper setting (Li et al., 2024, "Preserving Diversity in Supervised Fine-Tuning of Large Language Models",
# Tables 1 / 2): full fine-tuning of Llama-3-8B on UltraFeedback's SFT split with CE and with GEM-LS (beta 0.7),
# then instruction following (`distmatch_ifeval`, Table 1) and creative-writing diversity (`distmatch_creative`:
# poem and story prompts, 16 samples each, Table 2), UltraFeedback test perplexity and GEM figure 6's probe prompts
# (`distmatch-eval nexttoken`), then one report next to the paper's published numbers.
#
#   bash examples/reproduce/gem_llama3_8b_ultrafeedback.sh                 # from anywhere
#   DRY_RUN=1 bash examples/reproduce/gem_llama3_8b_ultrafeedback.sh       # print the commands, run nothing
#   LOSSES="ce ce_entropy gem_linear gem_ls" bash examples/reproduce/gem_llama3_8b_ultrafeedback.sh   # more of Table 1
#
# Needs: 8 CUDA GPUs with >= 40 GB (the config: ZeRO-2, global batch 128, 2048-token packed rows, 3 epochs),
# flash-attn and deepspeed in .venv-axolotl (`pip install 'axolotl[deepspeed]' flash-attn`), access to the gated
# meta-llama/Meta-Llama-3-8B (and -Instruct for the chat template), network for the models and data, and the
# environments of `make venvs` (see docs/development.md for CUDA torch). vLLM in .venv speeds up the 16-sample
# creative tasks (LM_EVAL_MODEL=vllm). Each step is skipped when its output exists. Not run by the test suite
# (tests/test_demo.py checks the syntax and a DRY_RUN).
set -euo pipefail

# --- settings (each can be overridden from the environment) --------------------------------------------------
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
AXOLOTL_CONFIG="${AXOLOTL_CONFIG:-$REPO_ROOT/examples/axolotl/llama3-8b-ultrafeedback-gem_ls.yaml}" # paper hyper-parameters
LOSSES="${LOSSES:-ce gem_ls}"       # one full fine-tune per loss (the config's `loss:` is replaced)
OUT="${OUT:-$REPO_ROOT/outputs/reproduce/gem-llama3-8b-ultrafeedback}"
LM_EVAL_TASKS="${LM_EVAL_TASKS:-distmatch_ifeval,distmatch_creative}"
LM_EVAL_MODEL="${LM_EVAL_MODEL:-hf}" # or vllm
LM_EVAL_DTYPE="${LM_EVAL_DTYPE:-bfloat16}"
LM_EVAL_BATCH_SIZE="${LM_EVAL_BATCH_SIZE:-auto}"
LM_EVAL_EXTRA="${LM_EVAL_EXTRA:-}" # more lm_eval flags, e.g. "--limit 20"
NEXTTOKEN="${NEXTTOKEN:-1}"         # 1: UltraFeedback test perplexity + figure-6 probes (distmatch-eval nexttoken)
NEXTTOKEN_SPLIT="${NEXTTOKEN_SPLIT:-test_sft}" # HuggingFaceH4/ultrafeedback_binarized split; the first NEXTTOKEN_ROWS
NEXTTOKEN_ROWS="${NEXTTOKEN_ROWS:-1000}"       # rows of it (GEM appendix D.1: 1,000 test samples)
PUBLISHED_MODEL="${PUBLISHED_MODEL:-llama-3-8b}"
DRY_RUN="${DRY_RUN:-0}" # 1: print the commands without running them
DONE_FILE=config.json   # a finished full fine-tune leaves the model in $OUT/<loss>/model
# Absolute paths, then run from the repository root: the Axolotl configs name paths relative to it (deepspeed, data).
OUT="$(mkdir -p "$OUT" && cd "$OUT" && pwd)"
AXOLOTL_CONFIG="$(realpath "$AXOLOTL_CONFIG")"
cd "$REPO_ROOT"
# shellcheck source=examples/reproduce/_common.sh
source "$REPO_ROOT/examples/reproduce/_common.sh"
AXOLOTL="${AXOLOTL:-$(pick .venv-axolotl/bin/axolotl axolotl)}"
CONFIG_PYTHON="${CONFIG_PYTHON:-$(pick .venv-axolotl/bin/python "$(pick .venv/bin/python python3)")}" # needs PyYAML
EVAL_PYTHON="${EVAL_PYTHON:-$(pick .venv/bin/python python3)}" # needs datasets (the UltraFeedback export)
LM_EVAL="${LM_EVAL:-$(pick .venv/bin/lm_eval lm_eval)}"
DISTMATCH_EVAL="${DISTMATCH_EVAL:-$(pick .venv/bin/distmatch-eval distmatch-eval)}"

# --- 1. supervised fine-tuning (Axolotl + the distmatch plugin, 8 GPUs) --------------------------------------------
train_all

# --- 2. IFEval and creative-writing diversity (lm-eval, with the model's chat template) -----------------------------
for loss in $LOSSES; do
	lm_eval_run "$loss" "pretrained=$OUT/$loss/model,dtype=$LM_EVAL_DTYPE" --apply_chat_template
done

# --- 3. next-token statistics: UltraFeedback test perplexity, GEM figure 6 probes --------------------------------
if [[ "$NEXTTOKEN" == 1 ]]; then
	data="$OUT/ultrafeedback_${NEXTTOKEN_SPLIT}_${NEXTTOKEN_ROWS}.jsonl"
	if [[ ! -s "$data" ]]; then
		log "exporting $NEXTTOKEN_ROWS rows of ultrafeedback_binarized/$NEXTTOKEN_SPLIT -> $data"
		run "$EVAL_PYTHON" -c '
import json, sys
from datasets import load_dataset
split, rows, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ds = load_dataset("HuggingFaceH4/ultrafeedback_binarized", split=split).select(range(rows))
with open(out, "w") as f:
    for i, row in enumerate(ds):
        f.write(json.dumps({"id": i, "messages": row["messages"]}) + "\n")
' "$NEXTTOKEN_SPLIT" "$NEXTTOKEN_ROWS" "$data"
	fi
	for loss in $LOSSES; do
		if [[ -s "$OUT/$loss/nexttoken.json" ]]; then
			log "$loss: $OUT/$loss/nexttoken.json exists, skipped"
			continue
		fi
		log "$loss: distmatch-eval nexttoken"
		run "$DISTMATCH_EVAL" nexttoken --model "$OUT/$loss/model" --data "$data" --benchmark ultrafeedback_test \
			--max-length 2048 --dtype "$LM_EVAL_DTYPE" -o "$OUT/$loss/nexttoken.json"
	done
fi

# --- 4. one report next to the published numbers ------------------------------------------------------------------
runs=()
for loss in $LOSSES; do
	runs+=(--run "$loss=$OUT/$loss/lm_eval")
	if [[ "$NEXTTOKEN" == 1 ]]; then runs+=(--run "$loss=$OUT/$loss/nexttoken.json"); fi
	if compgen -G "$OUT/$loss/model/checkpoint-*/trainer_state.json" >/dev/null; then
		runs+=(--run "$loss=$OUT/$loss/model") # training curves
	fi
done
log "report -> $OUT/report"
run "$DISTMATCH_EVAL" report "${runs[@]}" --published-model "$PUBLISHED_MODEL" \
	--title "GEM reproduction: Llama-3-8B SFT on UltraFeedback" -o "$OUT/report"
log "done: $OUT/report/report.md"
