# Each target creates .venv and installs what it needs when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The one version, pyproject.toml's: the image build passes it to the Dockerfile.
VERSION := $(shell $(PYTHON) -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")

.PHONY: test test-slow test-image test-browser test-newest rules demo dist bench lint lock image fake-service clean

# Installs are reproducible: the locked versions with their hashes (requirements/, `make lock`),
# then the project itself without dependencies, built by the locked setuptools.
# A source tree's leftover *.egg-info (an sdist build writes one) would shadow the installed version.
define install_locked
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	rm -rf session_archiver.egg-info
	$(1)/bin/python -m pip install -q --require-hashes -r $(2)
	$(1)/bin/python -m pip install -q --no-deps --no-build-isolation -e .
endef

$(STAMP): pyproject.toml requirements/dev.txt
	$(call install_locked,$(VENV),requirements/dev.txt)
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The whole-system runs kept out of `test` for its 10-minute budget (pytest -m slow); CI runs them.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

# Builds the container image (buildah + mmdebstrap, as root) and runs it: minutes, so not in `test`.
test-image: $(STAMP)
	$(BIN)/python -m pytest -q -m image tests/deploy/test_image.py $(PYTEST_ARGS)

# The evidence browser driven in a real Chromium (Debian's chromium + chromium-driver; skipped
# where they are missing, a failure under CI=true). BROWSE_SCREENSHOTS=docs refreshes the README's pictures.
# A venv of its own: selenium's dependencies (trio) would otherwise be imported by httpx in every
# process of the main venv and inflate what `make bench` measures.
BROWSER_VENV := .venv-browser
$(BROWSER_VENV)/.installed: pyproject.toml requirements/browser-test.txt
	$(call install_locked,$(BROWSER_VENV),requirements/browser-test.txt)
	touch $@

test-browser: $(BROWSER_VENV)/.installed
	$(BROWSER_VENV)/bin/python -m pytest -q -m browser tests/browse/test_chromium.py $(PYTEST_ARGS)

# The tests on the newest versions pyproject.toml allows (not the locked ones), in a venv of their
# own made afresh: tells early when an upgrade within the ranges breaks something. The packages
# newer than the lock are listed first.
NEWEST_VENV := .venv-newest
test-newest:
	rm -rf $(NEWEST_VENV)
	$(PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(NEWEST_VENV)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e '.[dev]'
	@echo "newer than requirements/dev.txt:"
	@$(NEWEST_VENV)/bin/python -m pip freeze --exclude-editable | tr 'A-Z_' 'a-z-' | sort > $(NEWEST_VENV)/newest.txt
	@grep -oE '^[a-z0-9.-]+==[^ ;]+' requirements/dev.txt | sort | comm -13 - $(NEWEST_VENV)/newest.txt | sed 's/^/  /'
	touch $(NEWEST_VENV)/.installed
	$(MAKE) test VENV=$(NEWEST_VENV)

# Refreshes the locks in requirements/ to the newest versions pyproject.toml allows (uv, itself
# locked in requirements/tools.txt); `make lock LOCK_ARGS=` re-resolves keeping the current pins.
# Resolved for the image's Python (3.11 on Linux) whatever machine runs it; every file's hash is
# kept, so the locks install on any CPU.
TOOLS_VENV := .venv-tools
LOCK_ARGS ?= --upgrade
UV_COMPILE = UV_CUSTOM_COMPILE_COMMAND="make lock" $(TOOLS_VENV)/bin/uv pip compile --quiet --generate-hashes \
	--python-version 3.11 --python-platform linux --system-certs $(LOCK_ARGS)
$(TOOLS_VENV)/.installed: requirements/tools.txt
	test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/python -m pip install -q --require-hashes -r requirements/tools.txt
	touch $@

lock: $(TOOLS_VENV)/.installed
	$(UV_COMPILE) -o requirements/runtime.txt pyproject.toml
	$(UV_COMPILE) -o requirements/build.txt requirements/build.in
	$(UV_COMPILE) -o requirements/dev.txt --extra dev -c requirements/runtime.txt -c requirements/build.txt \
		pyproject.toml requirements/build.in
	$(UV_COMPILE) -o requirements/browser-test.txt --extra browser-test -c requirements/dev.txt \
		pyproject.toml requirements/build.in
	$(UV_COMPILE) -o requirements/tools.txt requirements/tools.in

# The container image, labelled with pyproject's version: CONTAINER=podman or buildah also work.
CONTAINER ?= docker
IMAGE ?= ghcr.io/session-archiver/archiver
image:
	$(CONTAINER) build -t $(IMAGE):$(VERSION) --build-arg VERSION=$(VERSION) \
		--build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) .

# grafana/alerts/archiver.rules.yml is the chart's alert template rendered with default values.
rules: $(STAMP)
	$(BIN)/python -m tests.render_rules

# The locked build tools (pip, setuptools: requirements/build.txt) in a venv of their own: `make
# dist` builds with them, and their pip installs the demo's venv from outside it.
BUILD_VENV := .venv-build
$(BUILD_VENV)/.installed: requirements/build.txt
	test -x $(BUILD_VENV)/bin/python || $(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/python -m pip install -q --require-hashes -r requirements/build.txt
	touch $@

# dist/: the sdist and the wheel, built by the locked setuptools without build isolation (nothing
# downloaded at build time), as the image's build stage does. Install the wheel with the runtime
# lock: README, "Install". The in-tree build's leftovers (build/, *.egg-info) are removed: an
# egg-info in the source tree would shadow the dev venv's installed version.
WHEEL := dist/session_archiver-$(VERSION)-py3-none-any.whl
PACKAGE_SOURCES := pyproject.toml MANIFEST.in README.md LICENSE $(shell find archiver -type f ! -name '*.py[cod]' ! -path '*/__pycache__/*')
dist: $(WHEEL)
$(WHEEL): $(BUILD_VENV)/.installed $(PACKAGE_SOURCES)
	rm -rf dist build session_archiver.egg-info
	$(BUILD_VENV)/bin/python -m pip wheel -q --no-deps --no-build-isolation --wheel-dir dist .
	$(BUILD_VENV)/bin/python -c "from setuptools import build_meta; build_meta.build_sdist('dist')" >/dev/null
	rm -rf build session_archiver.egg-info
	@ls dist

# The demo's venv holds what a user installs and nothing else: the runtime lock and the wheel (no
# test tools, no pip of its own; the demo needs nothing more: its fake service is in the package).
DEMO_VENV := .venv-demo
$(DEMO_VENV)/.installed: requirements/runtime.txt $(WHEEL)
	test -x $(DEMO_VENV)/bin/python || $(PYTHON) -m venv --without-pip $(DEMO_VENV)
	$(BUILD_VENV)/bin/python -m pip --python $(DEMO_VENV)/bin/python install -q --require-hashes -r requirements/runtime.txt
	$(BUILD_VENV)/bin/python -m pip --python $(DEMO_VENV)/bin/python install -q --no-deps --force-reinstall $(WHEEL)
	touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/archiver demo $(DEMO_ARGS)

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
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) $(BROWSER_VENV) $(NEWEST_VENV) $(TOOLS_VENV) $(BUILD_VENV) $(DEMO_VENV) dist build \
		.pytest_cache .mypy_cache .ruff_cache
