# Two entry points: `make demo` and `make test`. Both build .venv from scratch if needed.
PY := .venv/bin/python
PIP := .venv/bin/pip

.PHONY: demo test setup dot browser bench docs clean

.venv/.installed: setup.py setup.cfg pyproject.toml
	python3 -m venv .venv
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[all]"
	touch .venv/.installed

dot:
	@command -v dot >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq graphviz >/dev/null)

# Headless Chromium for the interactive viewer's browser tests (Debian's packages; no download
# of a browser by a test tool, which the closed network would refuse).
browser:
	@(command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1) || \
		(apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null)

setup: .venv/.installed dot browser

demo: .venv/.installed dot
	$(PY) -m torchlog demo

test: setup
	$(PY) -m pytest tests torchlog vis storage

bench: setup
	$(PY) bench/run.py

# The documentation site (mkdocs.yml), strict: a broken link or an unparsable docstring fails it.
docs: .venv/.installed
	$(PY) -m mkdocs build --strict --site-dir build/docs

clean:
	rm -rf .venv build *.egg-info
