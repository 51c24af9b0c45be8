# meshplan: the two set-up commands are `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP_BASE := $(VENV)/.installed-base
STAMP_DEV := $(VENV)/.installed-dev
# exact versions of everything the dev install pulls (regenerate: make constraints)
CONSTRAINTS := constraints.txt
PIP_INSTALL = -m pip install --quiet -c $(CONSTRAINTS)
LOCK_VENV := $(or $(TMPDIR),/tmp)/meshplan-constraints-venv

.PHONY: demo test test-fast bench lint typecheck clean venv constraints docs

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) $(PIP_INSTALL) --upgrade pip

$(STAMP_BASE): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PY) $(PIP_INSTALL) -e .
	touch $@

$(STAMP_DEV): pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PY) $(PIP_INSTALL) -e '.[dev]'
	touch $@ $(STAMP_BASE)

venv: $(STAMP_BASE)

demo: $(STAMP_DEV)
	$(PY) -m meshplan.demo

test: $(STAMP_DEV)
	$(PY) -m pytest -q -n 2 --hypothesis-seed=0

# for iteration: the suite without the tests marked slow (make test runs them all)
test-fast: $(STAMP_DEV)
	$(PY) -m pytest -q -n 2 --hypothesis-seed=0 -m "not slow"

# the documentation site (mkdocs.yml) into site/; --strict: a warning (a broken link, a page
# outside the nav, a docstring mkdocstrings cannot read) fails the build
docs: $(STAMP_DEV)
	$(VENV)/bin/mkdocs build --strict

bench: $(STAMP_DEV)
	$(PY) -m benchmarks.run

lint: $(STAMP_DEV) typecheck
	$(VENV)/bin/ruff check .

# mypy on the public API modules ([tool.mypy] in pyproject.toml); make test runs it too
# (tests/meshplan/test_typecheck.py)
typecheck: $(STAMP_DEV)
	$(PY) -m mypy

# Regenerate constraints.txt: resolve the dev install afresh in a throw-away venv (no
# constraints) and freeze it; torch's local version tag (+cpu) is dropped so that the pin
# also matches the PyPI wheel.
constraints:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install --quiet -e '.[dev]'
	{ sed -n '/^#/p' $(CONSTRAINTS); $(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable \
	    | sed -E 's/^(torch==[^+]*)\+.*/\1/'; } > $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf $(LOCK_VENV)

clean:
	rm -rf $(VENV) build *.egg-info reports/demo site
