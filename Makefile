# klppo developer commands. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS ?= dev,tensorboard

.PHONY: venv demo demo-table test test-all test-verl lint api docs docs-check bench rlhf clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/klppo demo

# Regenerate docs/results/cartpole-demo (tables with the machine they were measured on, and
# report.html) from a demo run; `klppo demo` reuses the finished runs of an earlier one.
demo-table: $(STAMP)
	$(BIN)/klppo demo --out runs/demo
	$(BIN)/klppo snapshot runs/demo docs/results/cartpole-demo \
		--title "CartPole demo: the KLip-PPO four-way comparison" --command "make demo-table" \
		--smooth 5

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ''

# klppo.integrations.verl against the real verl, in a virtual environment of its own: verl 0.9.1
# pins tensordict<=0.10 and transformers<5.11, which the torchrl and trl extras exclude. Its
# metadata omits cachetools, uvicorn and fastapi, which its trainer module imports.
VERL_VENV := .venv-verl
test-verl:
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VERL_VENV)/bin/python -m pip install --quiet -e '.[dev]' verl==0.9.1 torch==2.13.0 \
		cachetools uvicorn fastapi
	$(VERL_VENV)/bin/python -m pytest -q tests/integrations/test_verl.py tests/integrations/test_verl_loss.py

# ruff (with no print outside the CLI and docstrings in core/ and nn/) and mypy on all of klppo
lint: $(STAMP)
	$(BIN)/ruff check klppo tests benchmarks tools examples
	$(BIN)/mypy

# The API reference, generated from the docstrings with pdoc (the docs extra, installed here if
# missing): build/api/index.html, one page per module (build/ is not committed).
api:
	$(MAKE) venv
	$(BIN)/python -c "import pdoc" 2>/dev/null || \
		$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[docs]'
	$(BIN)/python tools/build_api.py build/api

# The documentation site (mkdocs-material, with the API reference above): build/site/index.html.
# Warnings (a broken link, a missing anchor) are errors. docs-check opens every page in headless
# Chromium (apt-get install chromium): each loads without errors, images render, links resolve.
docs:
	$(MAKE) venv
	$(BIN)/python -c "import pdoc, mkdocs, material" 2>/dev/null || \
		$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[docs]'
	$(BIN)/python tools/build_docs.py

docs-check: docs
	$(BIN)/python tools/check_site.py build/site

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_losses.py

# The RLHF comparison (needs the lm extra): pretrain the reference once, then 4 arms x 2 seeds.
rlhf:
	$(MAKE) venv
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[lm]'
	test -f runs/lm/base/config.json || $(BIN)/klppo lm pretrain --out runs/lm/base
	$(BIN)/klppo rlhf compare --model runs/lm/base --out runs/rlhf-compare --seeds 0 1

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
