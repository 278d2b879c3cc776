# Two entry points: `make demo` and `make test`. Both build .venv from scratch if needed.
PY := .venv/bin/python
PIP := .venv/bin/pip

.PHONY: demo test setup dot bench clean

.venv/.installed: setup.cfg pyproject.toml
	python3 -m venv .venv
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[all]"
	touch .venv/.installed

dot:
	@command -v dot >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq graphviz >/dev/null)

setup: .venv/.installed dot

demo: setup
	$(PY) -m torchlog demo

test: setup
	$(PY) -m pytest tests torchlog vis storage

bench: setup
	$(PY) bench/run.py

clean:
	rm -rf .venv build *.egg-info
