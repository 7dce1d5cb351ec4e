#!/usr/bin/env bash
# EMO paper setting (Ren et al., ICLR 2024, Table 3 / Table 6): lightweight continual fine-tuning on WikiText-103 with
# LoRA, once with EMO and once with MLE (our `ce`), with the released script's settings (DRSY/EMO
# continual_finetuning/finetune_lora.sh: emo2, Llama-2-13B's LM head as cost embedding, fp16, LoRA r 32 / alpha 16 /
# dropout 0.05, 256-token blocks, lr 2e-5, 1 epoch, batch 16, 3% warm-up, seed 100), then in-context learning on the
# eight language-understanding tasks (`distmatch_nlu`: TE, SST-2, TREC, Subj, CR, RT, AG News, MMLU) with the protocol
# that produced the tables (`--metadata '{"protocol":"emo_official"}'`: the EMO code's icl.py templates, OpenICL's text
# round trip before retrieval, OpenICL's perplexity normalisation, MMLU averaged over its subjects; the paper's number
# is `acc_ppl`), then one report next to the published numbers.
#
#   bash examples/reproduce/emo_wikitext103_nlu.sh                  # Table 3: LLaMA-7B (huggyllama/llama-7b)
#   TABLE=6 bash examples/reproduce/emo_wikitext103_nlu.sh          # Table 6: LLaMA-2-7B (meta-llama/Llama-2-7b-hf)
#   DRY_RUN=1 bash examples/reproduce/emo_wikitext103_nlu.sh        # print the commands, run nothing
#   LOSSES=emo LM_EVAL_EXTRA="--limit 100" bash examples/reproduce/emo_wikitext103_nlu.sh   # a quick look
#
# Needs: one CUDA GPU with >= 40 GB (7B LoRA at micro batch 16, 256-token rows; the 7B model in float32 for the
# evaluation), network for the models (the 13B checkpoint is read once for its LM head), WikiText-103 and the NLU data
# (sentence-transformers/all-mpnet-base-v2 retrieves the demonstrations), and the environments of `make venvs`:
# .venv-axolotl (training) and .venv (lm-eval, distmatch-eval); on a GPU machine build them with
# TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu128" (docs/development.md). Each step is skipped when its
# output exists, so an interrupted run continues where it stopped. Not run by the test suite (tests/test_demo.py
# checks the syntax and a DRY_RUN).
set -euo pipefail

# --- settings (each can be overridden from the environment) --------------------------------------------------
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TABLE="${TABLE:-3}" # 3: LLaMA-7B (the paper's Table 3), 6: LLaMA-2-7B (Table 6)
case "$TABLE" in
3) TABLE_CONFIG=examples/axolotl/llama-7b-wikitext103-emo.yaml TABLE_MODEL=llama-7b ;;
6) TABLE_CONFIG=examples/axolotl/llama2-7b-wikitext103-emo.yaml TABLE_MODEL=llama2-7b ;;
*)
	echo "TABLE=$TABLE: expected 3 (LLaMA-7B) or 6 (LLaMA-2-7B)" >&2
	exit 2
	;;
esac
AXOLOTL_CONFIG="${AXOLOTL_CONFIG:-$REPO_ROOT/$TABLE_CONFIG}" # the released script's hyper-parameters
LOSSES="${LOSSES:-ce emo}"                                   # one LoRA fine-tune per loss; the paper compares MLE with EMO
EVAL_BASE="${EVAL_BASE:-1}"                                  # 1: also evaluate the pre-trained model (the tables' first row)
OUT="${OUT:-$REPO_ROOT/outputs/reproduce/emo-table$TABLE-wikitext103}"
LM_EVAL_TASKS="${LM_EVAL_TASKS:-distmatch_nlu}"
EMO_OFFICIAL='{"protocol":"emo_official"}'                  # the protocol behind the tables (docs/evaluation.md)
LM_EVAL_METADATA="${LM_EVAL_METADATA-$EMO_OFFICIAL}"         # lm_eval --metadata ('' for the tasks' defaults)
LM_EVAL_MODEL="${LM_EVAL_MODEL:-hf}"
LM_EVAL_DTYPE="${LM_EVAL_DTYPE:-float32}" # OpenICL's PPLInferencer loads the model with from_pretrained's default dtype
LM_EVAL_BATCH_SIZE="${LM_EVAL_BATCH_SIZE:-auto}"
LM_EVAL_EXTRA="${LM_EVAL_EXTRA:-}"                 # more lm_eval flags, e.g. "--limit 100"
PUBLISHED_MODEL="${PUBLISHED_MODEL:-$TABLE_MODEL}" # published rows shown: EMO Table 3 (LLaMa-7B) or 6 (LLaMa2-7B)
DRY_RUN="${DRY_RUN:-0}"                         # 1: print the commands without running them
DONE_FILE=adapter_config.json                   # a finished LoRA run leaves its adapter in $OUT/<loss>/model
# Absolute paths, then run from the repository root: the Axolotl configs name paths relative to it (deepspeed, data).
OUT="$(mkdir -p "$OUT" && cd "$OUT" && pwd)"
AXOLOTL_CONFIG="$(realpath "$AXOLOTL_CONFIG")"
cd "$REPO_ROOT"
# shellcheck source=examples/reproduce/_common.sh
source "$REPO_ROOT/examples/reproduce/_common.sh"
AXOLOTL="${AXOLOTL:-$(pick .venv-axolotl/bin/axolotl axolotl)}"
CONFIG_PYTHON="${CONFIG_PYTHON:-$(pick .venv-axolotl/bin/python "$(pick .venv/bin/python python3)")}" # needs PyYAML
# the model the adapters belong to: the config's base_model
BASE_MODEL="${BASE_MODEL:-$("$CONFIG_PYTHON" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["base_model"])' "$AXOLOTL_CONFIG")}"
LM_EVAL="${LM_EVAL:-$(pick .venv/bin/lm_eval lm_eval)}"
DISTMATCH_EVAL="${DISTMATCH_EVAL:-$(pick .venv/bin/distmatch-eval distmatch-eval)}"

# --- 1. continual fine-tuning (Axolotl + the distmatch plugin) ---------------------------------------------------
train_all

# --- 2. in-context learning on the NLU suite (lm-eval) ---------------------------------------------------------
if [[ "$EVAL_BASE" == 1 ]]; then
	lm_eval_run base "pretrained=$BASE_MODEL,dtype=$LM_EVAL_DTYPE"
fi
for loss in $LOSSES; do
	lm_eval_run "$loss" "pretrained=$BASE_MODEL,peft=$OUT/$loss/model,dtype=$LM_EVAL_DTYPE"
done

# --- 3. one report next to the published numbers ------------------------------------------------------------------
runs=()
if [[ "$EVAL_BASE" == 1 ]]; then runs+=(--run "base=$OUT/base/lm_eval"); fi
for loss in $LOSSES; do
	runs+=(--run "$loss=$OUT/$loss/lm_eval")
	# training curves, when Axolotl saved a checkpoint (its trainer_state.json)
	if compgen -G "$OUT/$loss/model/checkpoint-*/trainer_state.json" >/dev/null; then
		runs+=(--run "$loss=$OUT/$loss/model")
	fi
done
log "report -> $OUT/report"
run "$DISTMATCH_EVAL" report "${runs[@]}" --published-model "$PUBLISHED_MODEL" \
	--title "EMO reproduction (Table $TABLE): $BASE_MODEL continual fine-tuning on WikiText-103" -o "$OUT/report"
log "done: $OUT/report/report.md"
