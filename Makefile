# Each target creates .venv and installs what it needs when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-image test-browser rules demo bench lint fake-service clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Builds the container image (buildah + mmdebstrap, as root) and runs it: minutes, so not in `test`.
test-image: $(STAMP)
	$(BIN)/python -m pytest -q -m image tests/test_image.py $(PYTEST_ARGS)

# The evidence browser driven in a real Chromium (Debian's chromium + chromium-driver; skipped
# where they are missing, a failure under CI=true). BROWSE_SCREENSHOTS=docs refreshes the README's pictures.
# A venv of its own: selenium's dependencies (trio) would otherwise be imported by httpx in every
# process of the main venv and inflate what `make bench` measures.
BROWSER_VENV := .venv-browser
$(BROWSER_VENV)/.installed: pyproject.toml
	test -x $(BROWSER_VENV)/bin/python || $(PYTHON) -m venv $(BROWSER_VENV)
	$(BROWSER_VENV)/bin/python -m pip install -q --upgrade pip
	$(BROWSER_VENV)/bin/python -m pip install -q -e '.[browser-test]'
	touch $@

test-browser: $(BROWSER_VENV)/.installed
	$(BROWSER_VENV)/bin/python -m pytest -q -m browser tests/test_browse_chromium.py $(PYTEST_ARGS)

# grafana/alerts/archiver.rules.yml is the chart's alert template rendered with default values.
rules: $(STAMP)
	$(BIN)/python -m tests.render_rules

demo: $(STAMP)
	$(BIN)/archiver demo $(DEMO_ARGS)

fake-service: $(STAMP)
	$(BIN)/archiver fake-service $(FAKE_ARGS)

# The upload benchmarks compare against `rclone copy` (Debian's rclone): installed here when missing and run as root.
bench: $(STAMP)
	command -v rclone >/dev/null || { test "$$(id -u)" = 0 && apt-get install -y rclone; } || { echo "make bench needs rclone (apt-get install rclone)"; exit 1; }
	$(BIN)/python benchmarks/run_all.py

lint: $(STAMP)
	$(BIN)/ruff check archiver tests benchmarks
	$(BIN)/ruff format --check archiver tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(BROWSER_VENV) .pytest_cache .mypy_cache .ruff_cache
