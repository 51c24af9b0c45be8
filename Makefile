# meshplan: the two set-up commands are `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP_BASE := $(VENV)/.installed-base
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: demo test bench lint clean venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP_BASE): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $@

$(STAMP_DEV): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@ $(STAMP_BASE)

venv: $(STAMP_BASE)

demo: $(STAMP_DEV)
	$(PY) -m meshplan.demo

test: $(STAMP_DEV)
	$(PY) -m pytest -q -n 2 --hypothesis-seed=0

bench: $(STAMP_DEV)
	$(PY) -m benchmarks.run

lint: $(STAMP_DEV)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info reports/demo
