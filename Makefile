# The two commands a new user types: `make run` and `make test`.
# Everything else here is set-up they need not know about.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specchat-installed
MODEL  ?=
ARGS   ?=

.PHONY: run test test-all lint bench setup clean

run: $(STAMP)
	$(VENV)/bin/specchat run $(MODEL) $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q $(ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/specchat bench --prompts ../shared/bench/rewrite.jsonl --methods none,ngram --peers hf $(ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup.sh
	touch $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
