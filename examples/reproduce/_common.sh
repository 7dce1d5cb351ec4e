# Shared helpers of the paper-reproduction recipes (sourced, not run). Expects REPO_ROOT, OUT, AXOLOTL_CONFIG,
# LM_EVAL_* and DRY_RUN to be set by the recipe.
# shellcheck shell=bash

# pick VENV_BINARY FALLBACK: the binary of a `make venvs` environment when it exists, else FALLBACK (from PATH).
pick() { if [[ -x "$REPO_ROOT/$1" ]]; then echo "$REPO_ROOT/$1"; else echo "$2"; fi; }

log() { printf '\n==> %s\n' "$*" >&2; }

# run CMD...: print the command, then run it (DRY_RUN=1: only print it).
run() {
	printf '+ %s\n' "$*" >&2
	if [[ "${DRY_RUN:-0}" != 1 ]]; then "$@"; fi
}

# derive_config LOSS RUN_DIR: write RUN_DIR/axolotl.yaml, the recipe's Axolotl config with `loss` set to LOSS and
# `output_dir` to RUN_DIR/model (the other keys, the paper's hyper-parameters, unchanged, except the options of other
# losses, which the plugin refuses; comments are dropped).
derive_config() {
	mkdir -p "$2"
	"$CONFIG_PYTHON" -c '
import sys, yaml
source, loss, run_dir = sys.argv[1:]
with open(source) as f:
    cfg = yaml.safe_load(f)
if "loss" not in cfg:
    sys.exit(f"{source}: no `loss:` key - not a distmatch Axolotl config")
cfg["loss"] = loss
cfg["output_dir"] = run_dir + "/model"
try:  # options of the other losses would have no effect (the plugin refuses them): drop them
    from trl_ext.options import LOSS_OPTIONS
    for option in LOSS_OPTIONS:
        if loss not in option.losses:
            cfg.pop(option.name, None)
except ImportError:
    pass
with open(run_dir + "/axolotl.yaml", "w") as f:
    yaml.safe_dump(cfg, f, sort_keys=False)
' "$AXOLOTL_CONFIG" "$1" "$2"
	echo "$2/axolotl.yaml"
}

# has_lm_eval_results DIR: true when lm_eval already wrote results there (results_<date>.json in a model folder).
has_lm_eval_results() { [[ -d "$1" ]] && find "$1" -name 'results_*.json' -print -quit | grep -q .; }

# train_all: one Axolotl run per loss in LOSSES, skipped when DONE_FILE (relative to RUN_DIR/model) exists.
train_all() {
	local loss config
	for loss in $LOSSES; do
		if [[ -e "$OUT/$loss/model/$DONE_FILE" ]]; then
			log "$loss: $OUT/$loss/model/$DONE_FILE exists, training skipped"
			continue
		fi
		config="$(derive_config "$loss" "$OUT/$loss")"
		log "$loss: training ($config)"
		run "$AXOLOTL" train "$config"
	done
}

# lm_eval_run NAME MODEL_ARGS [EXTRA FLAGS...]: the recipe's lm-eval tasks for one model -> OUT/NAME/lm_eval
# (LM_EVAL_METADATA, when set, is passed as --metadata).
lm_eval_run() {
	local name="$1" model_args="$2"
	shift 2
	if has_lm_eval_results "$OUT/$name/lm_eval"; then
		log "$name: lm-eval results exist in $OUT/$name/lm_eval, skipped"
		return
	fi
	log "$name: lm_eval --tasks $LM_EVAL_TASKS"
	if [[ -n "${LM_EVAL_METADATA:-}" ]]; then set -- --metadata "$LM_EVAL_METADATA" "$@"; fi
	# shellcheck disable=SC2086  # LM_EVAL_EXTRA is a list of flags
	run "$LM_EVAL" --model "$LM_EVAL_MODEL" --model_args "$model_args" --tasks "$LM_EVAL_TASKS" \
		--batch_size "$LM_EVAL_BATCH_SIZE" --output_path "$OUT/$name/lm_eval" --log_samples "$@" $LM_EVAL_EXTRA
}
