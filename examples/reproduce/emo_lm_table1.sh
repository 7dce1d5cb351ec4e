#!/usr/bin/env bash
# EMO paper setting (Ren et al., ICLR 2024, Table 1): GPT-2 (small) or OPT-125M fine-tuned as a plain language model
# on each of the six open-ended corpora with MLE (our `ce`), TaiLr, MixCE and EMO, then scored by MAUVE on the
# corpus's test prefixes. Per corpus: its training / validation rows (examples/reproduce/emo_lm_data.py) and its test
# prompts (`distmatch-eval open-ended prompts`); per loss (TaiLr and MixCE once per gamma in {0.9, 0.8, 0.7}, the
# paper's sweep) and training seed: one `trl sft` run of the recipe (examples/trl/emo_lm_<model>.yaml: 3 epochs,
# AdamW, lr 5e-5, batch 32, 256 tokens, the lowest-validation-loss checkpoint), then `distmatch-eval generate` with the
# protocol's decoding (ancestral, forced length, 5 samples per prefix = the 5 sampling rounds); per loss: one
# `distmatch-eval open-ended score` over the seeds' samples (MAUVE x100 per round, mean and std over 5 rounds x 3
# seeds, the table's numbers) -> OUT/<corpus>/<run>/scores.json, and OUT/table1.md with every run's MAUVE.
#
#   bash examples/reproduce/emo_lm_table1.sh                    # GPT-2, the whole table (6 x 8 runs x 3 seeds)
#   MODEL=opt125m bash examples/reproduce/emo_lm_table1.sh      # OPT-125M
#   DRY_RUN=1 bash examples/reproduce/emo_lm_table1.sh          # print the commands, run nothing
#   CORPORA=ptb LOSSES="ce emo" SEEDS=1 bash examples/reproduce/emo_lm_table1.sh   # a quick look
#
# TaiLr runs as the EMO code's `tvd` baseline (`--tailr_variant emo_code`, its gamma convention: 1 is MLE), the
# formula behind the table's TaiLr rows (docs/losses.md). WebText and WritingPrompts have no Hub copy: give MixCE's
# split files as WEBTEXT_TRAIN / WEBTEXT_VALID / WEBTEXT_TEST (WRITINGPROMPTS_*); any corpus can be read from local
# files the same way (<CORPUS>_TRAIN, <CORPUS>_VALID, <CORPUS>_TEST), else from the Hub.
# Needs: one CUDA GPU (the whole table: 6 corpora x 8 runs x 3 seeds = 144 trainings of 3 epochs per model),
# network for the models, the Hub corpora and gpt2-large (MAUVE's features), and the `make venvs` environment .venv
# (trl with distmatch, distmatch-eval); on a GPU machine build it with
# TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu128" (docs/development.md). Each step is skipped when
# its output exists (a training when its model folder holds model.safetensors, written at the end), so an
# interrupted run continues with the next missing step. Not run by the test suite (tests/trl/test_emo_lm_recipes.py
# checks the syntax and a DRY_RUN).
set -euo pipefail

# --- settings (each can be overridden from the environment) --------------------------------------------------
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MODEL="${MODEL:-gpt2}" # gpt2 (GPT-2 small) or opt125m (OPT-125M)
case "$MODEL" in
gpt2 | opt125m) ;;
*)
	echo "MODEL=$MODEL: expected gpt2 or opt125m" >&2
	exit 2
	;;
esac
TRL_CONFIG="${TRL_CONFIG:-$REPO_ROOT/examples/trl/emo_lm_$MODEL.yaml}" # the paper's training settings
CORPORA="${CORPORA:-wikitext2 wikitext103 webtext ptb writingprompts ag_news}"
LOSSES="${LOSSES:-ce tailr mixce emo}"
GAMMAS="${GAMMAS:-0.9 0.8 0.7}" # TaiLr / MixCE coefficient sweep (EMO Section 4.1)
SEEDS="${SEEDS:-1 2 3}"         # training seeds (the paper: 3, values not given); also the sampling seeds
DATA_DIR="${DATA_DIR:-$REPO_ROOT/data/emo_lm}"
OUT="${OUT:-$REPO_ROOT/outputs/reproduce/emo-table1-$MODEL}"
GEN_BATCH_SIZE="${GEN_BATCH_SIZE:-32}"
SCORE_EXTRA="${SCORE_EXTRA:-}" # more `open-ended score` flags, e.g. "--oracle gpt2-large" (Table 2's PPL_oracle)
DRY_RUN="${DRY_RUN:-0}"        # 1: print the commands without running them
OUT="$(mkdir -p "$OUT" && cd "$OUT" && pwd)"
TRL_CONFIG="$(realpath "$TRL_CONFIG")"
cd "$REPO_ROOT"
# shellcheck source=examples/reproduce/_common.sh
source "$REPO_ROOT/examples/reproduce/_common.sh"
TRL="${TRL:-$(pick .venv/bin/trl trl)}"
PYTHON="${CONFIG_PYTHON:-$(pick .venv/bin/python python3)}"
DISTMATCH_EVAL="${DISTMATCH_EVAL:-$(pick .venv/bin/distmatch-eval distmatch-eval)}"
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" # eval_tasks for the data script and the flags below

# local_file CORPUS PART: the local file named by <CORPUS>_<PART> (e.g. WEBTEXT_TRAIN), or nothing
local_file() { local name="${1^^}_$2"; echo "${!name:-}"; }

for corpus in $CORPORA; do # MixCE's (and the GPT-2 output dataset's) split files have no Hub copy: refused first
	if [[ "$corpus" == webtext || "$corpus" == writingprompts || "$corpus" == gpt2_large ]]; then
		for part in TRAIN VALID TEST; do
			if [[ -z "$(local_file "$corpus" "$part")" ]]; then
				echo "${corpus^^}_$part is not set: $corpus has no Hub copy; give its train / valid / test split files" >&2
				exit 2
			fi
		done
	fi
done

# --- 1. per corpus: the LM data and the test prompts ------------------------------------------------------------
for corpus in $CORPORA; do
	if [[ -e "$DATA_DIR/$corpus/validation.jsonl" ]]; then
		log "$corpus: $DATA_DIR/$corpus exists, data skipped"
	else
		args=()
		if [[ -n "$(local_file "$corpus" TRAIN)" ]]; then args+=(--source "$(local_file "$corpus" TRAIN)"); fi
		if [[ -n "$(local_file "$corpus" VALID)" ]]; then args+=(--valid-source "$(local_file "$corpus" VALID)"); fi
		run "$PYTHON" examples/reproduce/emo_lm_data.py "$corpus" --out "$DATA_DIR/$corpus" "${args[@]}"
	fi
	if [[ ! -e "$OUT/$corpus/prompts.jsonl" ]]; then
		data=()
		if [[ -n "$(local_file "$corpus" TEST)" ]]; then data+=(--data "$(local_file "$corpus" TEST)"); fi
		mkdir -p "$OUT/$corpus"
		run "$DISTMATCH_EVAL" open-ended prompts --corpus "$corpus" "${data[@]}" -o "$OUT/$corpus/prompts.jsonl"
	fi
done

# --- 2. per corpus, loss (x gamma) and seed: train, sample; per loss: score over the seeds --------------------------
# runs LOSS: "name loss-options" lines, one per setting of the loss (TaiLr / MixCE: one per gamma)
runs() {
	case "$1" in
	tailr) for g in $GAMMAS; do echo "tailr-g$g --loss tailr --tailr_variant emo_code --tailr_gamma $g"; done ;;
	mixce) for g in $GAMMAS; do echo "mixce-g$g --loss mixce --mixce_gamma $g"; done ;;
	# EMO as gpt2.py's mode emo computes it: D = the true DEMD, the target's own mass in its value (no gt_q)
	emo) echo "emo --loss emo --emo_target_mass included" ;;
	*) echo "$1 --loss $1" ;;
	esac
}

for corpus in $CORPORA; do
	# shellcheck disable=SC2207  # the protocol's generate flags: words without spaces
	flags=($("$PYTHON" -c 'import sys; from eval_tasks.open_ended import CORPORA, decoding_flags; print(" ".join(decoding_flags(CORPORA[sys.argv[1]])))' "$corpus"))
	for loss in $LOSSES; do
		while read -r name options; do
			samples=()
			for seed in $SEEDS; do
				dir="$OUT/$corpus/$name/seed$seed"
				if [[ -e "$dir/model/model.safetensors" ]]; then
					log "$corpus $name seed $seed: trained ($dir/model), skipped"
				else
					log "$corpus $name seed $seed: training"
					# shellcheck disable=SC2086  # options: the loss's flags
					run "$TRL" sft --config "$TRL_CONFIG" --dataset_name "$DATA_DIR/$corpus" $options \
						--seed "$seed" --output_dir "$dir/model"
				fi
				if [[ ! -e "$dir/samples.jsonl" ]]; then
					run "$DISTMATCH_EVAL" generate --model "$dir/model" --prompts "$OUT/$corpus/prompts.jsonl" \
						-o "$dir/samples.jsonl" "${flags[@]}" --seed "$seed" --batch-size "$GEN_BATCH_SIZE"
				fi
				samples+=("$dir/samples.jsonl")
			done
			if [[ ! -e "$OUT/$corpus/$name/scores.json" ]]; then
				log "$corpus $name: MAUVE over ${#samples[@]} seed(s) x 5 rounds"
				# shellcheck disable=SC2086  # SCORE_EXTRA is a list of flags
				run "$DISTMATCH_EVAL" open-ended score "${samples[@]}" -o "$OUT/$corpus/$name/scores.json" $SCORE_EXTRA
			fi
		done < <(runs "$loss")
	done
done

# --- 3. one table: MAUVE mean +- std per corpus and run --------------------------------------------------------
log "table -> $OUT/table1.md"
run "$PYTHON" -c '
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
lines = ["| corpus | run | MAUVE (mean +- std over rounds x seeds) | seeds |", "|---|---|---|---|"]
for path in sorted(out.glob("*/*/scores.json")):
    score = json.loads(path.read_text())
    mean, std, seeds = score["mauve"]["mean"], score["mauve"]["std"], len(score["seeds"])
    lines.append(f"| {path.parent.parent.name} | {path.parent.name} | {mean:.2f} +- {std:.2f} | {seeds} |")
(out / "table1.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
' "$OUT"
log "done: $OUT/table1.md (the published numbers: eval_tasks/published/emo_iclr2024.json)"
