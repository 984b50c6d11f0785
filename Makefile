# Two entry points for a fresh machine: `make rehearse` and `make test`.
# Everything else here is a building block of those two.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
# WITH_VLLM=0 skips the ~4 min vLLM install on a laptop (vLLM tests then skip; in CI they fail).
WITH_VLLM ?= 1

.PHONY: help venv system-deps rehearse rehearse-fleet test lint pytest clean

help:
	@echo "make rehearse   offline rehearsal: the real launcher brings up a simulated pair on two"
	@echo "                netns test hosts over real ssh, sends a chat request, tears down (root)"
	@echo "make rehearse-fleet  the fleet command brings up two simulated pairs + the real vLLM"
	@echo "                router on five netns hosts: chat, failover, recovery, down (root)"
	@echo "make test       lint (ruff, shellcheck) + the whole test suite"

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q -U pip

venv: $(VPY)
	$(VPY) -m pip install -q -e '.[bench,sim,perfmodel,dev,fleet]' -e mods/dsv4-flash-overlays
	@if [[ "$(WITH_VLLM)" == "1" ]]; then \
	  $(VPY) -c 'import vllm' 2>/dev/null || { echo "installing vllm==0.33.0 (~4 min, ~9 GB)"; \
	  $(VPY) -m pip install -q 'vllm==0.33.0'; }; fi

system-deps:
	bash scripts/ensure_system_deps.sh

rehearse: system-deps venv
	$(VPY) -m sim.rehearsal

rehearse-fleet: system-deps venv
	$(VPY) -m sim.rehearsal.fleet

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	shellcheck -x $$(git ls-files '*.sh') .ci/run sim/rehearsal/bin/docker sim/rehearsal/bin/vllm \
	  sim/rehearsal/bin/vllm-router

pytest: venv
	$(VPY) -m pytest -q

test: system-deps lint pytest

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
