# The two commands of the README:  `make book`  and  `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# Dataset folder: $SUBFL_DATA_ROOT if set; else a shared data folder beside the checkout if there is one; else data/.
SUBFL_DATA_ROOT ?= $(if $(wildcard ../shared/data/PROVENANCE.md),$(abspath ../shared/data),$(CURDIR)/data)
export SUBFL_DATA_ROOT

.PHONY: setup book site test status verify fmnist chromium mathjax nbval-store

# Test processes: two one-thread workers (pytest-xdist) beat one two-thread process on a 2-core machine. A notebook's
# cells stay together on one worker (--dist loadfile); files are handed out in the order conftest.py sorts them, the
# files with slow tests first (not xdist's default, the files with most tests first), so that no long file ends the
# run on one worker. TEST_WORKERS= runs the suite in one process. The notebooks' kernels are processes of their own:
# OMP_NUM_THREADS=1 gives them one torch thread too (with two workers, two-thread kernels oversubscribe the cores and
# their many tiny operations wait on each other).
TEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[book,test,flower]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# Fashion-MNIST comes from Debian's dataset-fashion-mnist package (installed when we may, else a hint).
fmnist:
	@if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then \
	  if [ "$$(id -u)" = 0 ]; then (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null; \
	  else echo "note: 'sudo apt-get install dataset-fashion-mnist' provides Fashion-MNIST offline"; fi; fi

# The browser check of the site (tests/book/test_browser.py, python -m subfl_book.browser) drives Debian's chromium.
chromium:
	@if ! command -v chromium >/dev/null && [ -z "$$SUBFL_CHROMIUM" ]; then \
	  if [ "$$(id -u)" = 0 ]; then (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null; \
	  else echo "note: 'sudo apt-get install chromium' lets the browser check of the site run"; fi; fi

# MathJax for reading offline: npm's mathjax 3.2.2 (its tarball sha256-checked) into _mathjax/ (not tracked):
# the component the site loads (tex-mml-chtml.js) and the input/output/ui/a11y parts it may fetch, 5.5 MB.
# subfl_book.sphinx_mathjax copies it into the site's _static/mathjax/ and loads it from there when it is there
# (not under _static/: Jupyter Book would add every .js file there to every page); otherwise the site uses the CDN.
MATHJAX_VERSION := 3.2.2
MATHJAX_SHA256 := 1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09
mathjax: _mathjax/tex-mml-chtml.js
_mathjax/tex-mml-chtml.js:
	@tmp=$$(mktemp -d); \
	if command -v npm >/dev/null && (cd $$tmp && npm pack --silent mathjax@$(MATHJAX_VERSION) >/dev/null 2>&1) && \
	  echo "$(MATHJAX_SHA256)  $$tmp/mathjax-$(MATHJAX_VERSION).tgz" | sha256sum --check --quiet && \
	  tar -xzf $$tmp/mathjax-$(MATHJAX_VERSION).tgz -C $$tmp package/es5 package/LICENSE; then \
	  rm -rf _mathjax && mkdir -p _mathjax && cp $$tmp/package/LICENSE _mathjax/ && \
	  (cd $$tmp/package/es5 && cp -r tex-mml-chtml.js input output ui a11y $(CURDIR)/_mathjax/); \
	else echo "note: MathJax $(MATHJAX_VERSION) not installed (needs npm and the npm registry): the site loads it from its CDN"; fi; \
	rm -rf $$tmp

setup: $(VENV)/.installed fmnist chromium mathjax

book: setup
	$(VENV)/bin/subfl-book --scale cpu

site: setup
	$(VENV)/bin/subfl-book --build-only

status: setup
	$(VENV)/bin/subfl-book --status

# execute every fresh page again from the store and compare its outputs with the committed copy
verify: setup
	$(VENV)/bin/subfl-book --verify

# The ci-scale runs the notebook checks read (tests/nbval-store/): computed anew by the current code and recorded.
nbval-store: setup
	$(PY) scripts/record_nbval_store.py

test: setup
	SUBFL_SCALE=ci OMP_NUM_THREADS=1 $(PY) -m pytest tests notebooks --nbval-lax -p no:cacheprovider -q --durations=25 \
	  $(TEST_WORKERS)
