# Each target bootstraps .venv itself: a fresh machine needs nothing but Python 3.11+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
BASE   := $(VENV)/.stamp-base
FULL   := $(VENV)/.stamp-full
REF    := scenarios/v4pro-dspark-10stage-wan.yaml
# pytest workers: both cores by default; PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 2

.PHONY: demo test test-slow figures approximations bench lint format clean lock

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# installs are constrained to the tested versions (constraints.txt; `make lock` rewrites it)
$(BASE): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e .
	touch $@

$(FULL): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,real,dist]'
	touch $@ $(BASE)

# after a deliberate upgrade (pip install -U ... in .venv) and a green `make test`
lock: $(FULL)
	@{ sed -n '/^#/p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable \
	   | grep -v '^-e\|@ file\|^wansim'; } > constraints.txt.new && mv constraints.txt.new constraints.txt

demo: $(BASE)
	$(BIN)/wansim run $(REF) --engine both --out out/demo

# lint first (ruff, pinned in the dev extra); pytest exits 5 when it collects nothing: that is
# not a failure of the suite.
test: $(FULL)
	$(BIN)/ruff format --check --quiet . && $(BIN)/ruff check --quiet .
	@rc=0; $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) || rc=$$?; \
	 if [ $$rc -eq 5 ]; then rc=0; fi; exit $$rc

test-slow: $(FULL)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m slow

figures: $(FULL)
	$(BIN)/python -m wansim figures

# the measured error of the analytical approximations against the DES (docs/approximations.md)
approximations: $(FULL)
	$(BIN)/python -m wansim.studies.approximation_error

bench: $(FULL)
	$(BIN)/python benchmarks/run_all.py

lint: $(FULL)
	$(BIN)/ruff format --check . && $(BIN)/ruff check .

format: $(FULL)
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) out paper_figures/out .pytest_cache .hypothesis
