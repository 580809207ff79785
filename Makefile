# `make test` and `make demo` set themselves up: they create .venv if missing and install exactly the versions of
# requirements/lock.txt (every package; torch is the CPU build on this machine's disk, installed first, so no
# dependency pulls the multi-GB CUDA build). tools/envs.py does the installing and checks the result against the lock.
#
#   make test          the suite without the tests marked slow, on the locked (newest tested) versions, then the
#                      compatibility session: generation and loading tests on the oldest versions setup.cfg allows
#                      (requirements/lock-oldest.txt). About 4 minutes on 2 cores
#   make test-slow     the tests marked slow (learning runs, subprocesses, kills, benchmarks, studies): about 13 minutes
#   make test-all      both (.ci/run runs both)
#   make test-latest   the whole suite on the newest releases setup.cfg's ranges allow today (.venv-latest)
#   make lock          rewrite requirements/lock.txt from .venv (after a tested upgrade)
#   make fix-copies    rewrite the family folders' copies of itune_hf/models/_shared/ (remote code carries them)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LOCK := requirements/lock.txt
OLDEST_LOCK := requirements/lock-oldest.txt
STAMP := $(VENV)/.itune-installed
OLDEST_VENV := .venv-oldest
OLDEST_STAMP := $(OLDEST_VENV)/.itune-installed
LATEST_VENV := .venv-latest
ENVS := $(PYTHON) tools/envs.py
PYTEST_ARGS ?= -q -n 2 --durations=20
# The compatibility session: what a transformers/PEFT/Accelerate/datasets release can break (generation, the cache,
# loading, the Auto classes and pipeline, the PEFT adapter type, training steps through Accelerate).
COMPAT_TESTS := $(addprefix tests/models/,test_modeling.py test_xgpt_modeling.py test_baselines.py \
	test_generation_contract.py test_smollm2_integration.py) \
	tests/adapter/test_peft_adapter.py tests/adapter/test_registration.py tests/test_inference_vocabulary.py \
	tests/hub/test_auto_and_hub.py tests/test_pipelines.py tests/package/test_dependency_range.py

.PHONY: test test-slow test-all test-oldest test-latest demo quality format lock fix-copies clean-venv

$(STAMP): setup.cfg pyproject.toml Makefile tools/envs.py $(LOCK)
	$(ENVS) install $(VENV) --lock $(LOCK)
	touch $@

$(OLDEST_STAMP): setup.cfg pyproject.toml Makefile tools/envs.py $(OLDEST_LOCK)
	$(ENVS) install $(OLDEST_VENV) --lock $(OLDEST_LOCK) --extras test
	touch $@

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) -m "not slow"
	$(MAKE) --no-print-directory test-oldest

test-slow: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS) -m slow

test-all: test test-slow

test-oldest: $(OLDEST_STAMP)
	$(OLDEST_VENV)/bin/python -m pytest $(PYTEST_ARGS) $(COMPAT_TESTS)

test-latest:
	$(ENVS) install $(LATEST_VENV) --latest
	$(LATEST_VENV)/bin/python -m pip list --disable-pip-version-check | grep -i -E "^(transformers|peft|accelerate|datasets) "
	ITUNE_UNLOCKED=1 $(LATEST_VENV)/bin/python -m pytest $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) -m itune_hf.cli demo

fix-copies:
	$(PYTHON) tools/fix_copies.py

lock: $(STAMP)
	$(ENVS) lock $(VENV) --out $(LOCK)

quality: $(STAMP)
	$(PY) -m ruff check itune_hf tests benchmarks examples tools
	$(PY) -m ruff format --check itune_hf tests benchmarks examples tools

format: $(STAMP)
	$(PY) -m ruff check --fix itune_hf tests benchmarks examples tools
	$(PY) -m ruff format itune_hf tests benchmarks examples tools

clean-venv:
	rm -rf $(VENV) $(OLDEST_VENV) $(LATEST_VENV)
