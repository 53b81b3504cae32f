# Two commands matter: `make demo` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.installed-core
DEV := $(VENV)/.installed-dev
# What `make test` installs (`make demo`: train only); scripts/deps.py and the lock take it too.
EXTRAS := dev,train,envs,games,vision,ray,agents,reasoning-gym,textworld,mcp

.PHONY: demo extras test test-latest lock check install fmt clean chromium slurm gcc test-sglang docker \
	bubblewrap harnesses interop bench-smoke bench-smoke-record

# Installs take the exact versions of requirements/lock.txt (pip constraints; `make lock`
# refreshes it), so a fresh machine gets what was tested. pip reads PIP_CONSTRAINT in every pip
# it runs, the isolated build of the project included. `make test LOCK=` installs from
# pyproject.toml's ranges instead (the lock is made on CPython 3.11, Linux x86_64).
LOCK ?= requirements/lock.txt
PIN := $(if $(LOCK),PIP_CONSTRAINT=$(LOCK))

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIN) $(PY) -m pip install -q --upgrade pip

# The demo needs the core install plus the train extra (torch); `time make demo` on a fresh
# clone of this 2-core machine: 2 min 4 s, install included.
# torch is pinned to a CPU build here; the `train` extra itself accepts any torch >= 2.4.
TORCH ?= torch==2.13.0

$(CORE): pyproject.toml $(LOCK) | $(VENV)/bin/python
	$(PIN) $(PY) -m pip install -q $(TORCH)
	$(PIN) $(PY) -m pip install -q -e '.[train]'
	touch $(CORE)

$(DEV): pyproject.toml $(LOCK) | $(VENV)/bin/python
	$(PIN) $(PY) -m pip install -q $(TORCH)
	$(PIN) $(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $(CORE) $(DEV)

install: $(DEV)

demo: $(CORE)
	$(PY) -m atropos demo

# After `make demo`: the packages every built-in environment needs, into .venv, from the lock
# (the extras of EXTRAS that environments import; README, "Set-up"). Left out: `verifiers`
# (pins openai < 3, which `agents` cannot share: a venv of its own, docs/ecosystem.md), `hub`
# and `embeddings` (hub datasets and npc_arena's optional retriever: every environment runs on
# its shipped fixture and BM25 without them; not in the lock), `ray` (a launch backend) and
# `dev` (the tests). textworld's jericho builds with a C compiler (the gcc target).
ENV_EXTRAS := envs,games,vision,textworld,mcp,agents,reasoning-gym
ENVX := $(VENV)/.installed-extras

$(ENVX): $(CORE)
	$(PIN) $(PY) -m pip install -q -e '.[train,$(ENV_EXTRAS)]'
	touch $(ENVX)

extras: gcc $(ENVX)

# The one check command: format, lint, types, tests.
# The dashboard's browser test drives Debian's chromium; installed here when missing (root, or
# sudo without a password; otherwise that test says how to install it).
CHROMIUM := $(shell command -v chromium 2>/dev/null)

chromium:
ifeq ($(CHROMIUM),)
	@if [ "$$(id -u)" = 0 ]; then apt-get install -y -q chromium >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null); \
	elif sudo -n true 2>/dev/null; then sudo apt-get install -y -q chromium >/dev/null 2>&1 || \
		(sudo apt-get update -q >/dev/null && sudo apt-get install -y -q chromium >/dev/null); \
	else echo "chromium not installed and no root: the dashboard browser test will fail"; fi
endif

# The Slurm tests (tests/launch) start a real one-node cluster (atropos.testing.slurm) from
# Debian's packages; installed here when one of their programs is missing, like chromium.
# Nothing is configured or enabled: the tests run the daemons themselves, from a temporary folder.
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
SLURM_FOUND := $(shell PATH="$$PATH:/usr/sbin:/sbin"; \
	for prog in sbatch slurmctld slurmd munged; do command -v $$prog; done | wc -l)

slurm:
ifneq ($(strip $(SLURM_FOUND)),4)
	@if [ "$$(id -u)" = 0 ]; then apt-get install -y -q $(SLURM_PACKAGES) >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q $(SLURM_PACKAGES) >/dev/null); \
	elif sudo -n true 2>/dev/null; then sudo apt-get install -y -q $(SLURM_PACKAGES) >/dev/null 2>&1 || \
		(sudo apt-get update -q >/dev/null && sudo apt-get install -y -q $(SLURM_PACKAGES) >/dev/null); \
	else echo "Slurm not installed and no root: the Slurm tests will fail;" \
		"install with: sudo apt-get install -y $(SLURM_PACKAGES)"; fi
endif

# The Docker tests (tests/sandbox_engine) run their own dockerd and containerd
# (atropos.testing.docker) and build their image from the Debian mirrors with mmdebstrap;
# installed here when one is missing, like Slurm. Nothing is enabled: no system dockerd runs.
DOCKER_PACKAGES := docker.io mmdebstrap
DOCKER_FOUND := $(shell PATH="$$PATH:/usr/sbin:/sbin"; \
	for prog in dockerd containerd docker mmdebstrap; do command -v $$prog; done | wc -l)

docker:
ifneq ($(strip $(DOCKER_FOUND)),4)
	@if [ "$$(id -u)" = 0 ]; then apt-get install -y -q $(DOCKER_PACKAGES) >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q $(DOCKER_PACKAGES) >/dev/null); \
	elif sudo -n true 2>/dev/null; then sudo apt-get install -y -q $(DOCKER_PACKAGES) >/dev/null 2>&1 || \
		(sudo apt-get update -q >/dev/null && sudo apt-get install -y -q $(DOCKER_PACKAGES) >/dev/null); \
	else echo "Docker not installed and no root: the Docker tests will fail;" \
		"install with: sudo apt-get install -y $(DOCKER_PACKAGES)"; fi
endif

# The sandbox tests (tests/sandbox) run the bubblewrap provider with Debian's bwrap; installed
# here when missing, like chromium.
BWRAP := $(shell command -v bwrap 2>/dev/null)

bubblewrap:
ifeq ($(BWRAP),)
	@if [ "$$(id -u)" = 0 ]; then apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null); \
	elif sudo -n true 2>/dev/null; then sudo apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
		(sudo apt-get update -q >/dev/null && sudo apt-get install -y -q bubblewrap >/dev/null); \
	else echo "bwrap not installed and no root: the bubblewrap sandbox tests will fail;" \
		"install with: sudo apt-get install -y bubblewrap"; fi
endif

# The agent harnesses the harness tests run (tests/harnesses): Claude Code and Codex CLI from
# npm, mini-SWE-agent in a venv of its own, each at its pinned version under the harness cache
# (atropos.harnesses.cache: ~/.cache/atropos/harnesses, or /var/cache/atropos/harnesses for a
# root whose home sandboxes cannot reach); a no-op when there.
harnesses: $(DEV)
	$(PY) -m atropos.harnesses

# The official packages of the environment protocols we run and publish (tests/interop,
# benchmarks/interop_overhead.py): openreward and openenv-core in a venv of their own on this
# machine's python3.11 (openreward pins sse-starlette 2.3.6, which ours does not share). mcp is
# pinned below 2: openenv-core's fastmcp would take mcp 2.3+, whose sse-starlette >= 3 that pin
# refuses. Installed from its own lock, requirements/interop.txt (the whole venv frozen; pip
# constraints); the stamp holds the package list and the lock's checksum, so a changed list or
# lock makes the venv again; a no-op when there.
INTEROP_PYTHON ?= python3.11
INTEROP_VENV := .cache/interop-venv
INTEROP_PACKAGES := openreward==0.1.167 openenv-core==0.3.0 mcp==1.30.0
INTEROP_LOCK := requirements/interop.txt
INTEROP_STAMP = $(INTEROP_PACKAGES) $(shell cksum < $(INTEROP_LOCK))

interop:
	@if [ "$$(cat $(INTEROP_VENV)/.installed 2>/dev/null)" != "$(INTEROP_STAMP)" ]; then \
		echo "creating $(INTEROP_VENV) with $(INTEROP_PACKAGES) ..." && \
		$(INTEROP_PYTHON) -m venv --clear $(INTEROP_VENV) && \
		PIP_CONSTRAINT=$(INTEROP_LOCK) $(INTEROP_VENV)/bin/python -m pip install -q \
			--disable-pip-version-check $(INTEROP_PACKAGES) && \
		echo "$(INTEROP_STAMP)" > $(INTEROP_VENV)/.installed; fi

test: $(DEV) chromium slurm docker bubblewrap harnesses interop
	$(PY) scripts/check
	$(PY) benchmarks/smoke.py

# The performance guard (in `make test`, after the tests, ~35 s): CPU per unit of each hot path
# (API ingest and /batch, packer, sender, proxy, env runtime) against
# benchmarks/smoke_baseline.json; fails past 2x. `bench-smoke-record` re-measures the baseline
# (on an idle machine, when a slowdown is intended; commit the file with the change).
bench-smoke: $(DEV)
	$(PY) benchmarks/smoke.py

bench-smoke-record: $(DEV)
	$(PY) benchmarks/smoke.py --record

# The SGLang tests (tests/sglang: SGLang 0.5.23 itself on the CPU, from an 11 GB venv that
# scripts/upstream_venv.py builds from requirements/sglang.txt) are opt-in: venv and tests would
# add 9 to 12 minutes to `make test` (docs/inference.md, "SGLang on a CPU"). They run SGLang
# with a stub libcuda.so.1 built with gcc, installed here when missing, like chromium.
GCC := $(shell command -v gcc 2>/dev/null)

gcc:
ifeq ($(GCC),)
	@if [ "$$(id -u)" = 0 ]; then apt-get install -y -q gcc >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q gcc >/dev/null); \
	elif sudo -n true 2>/dev/null; then sudo apt-get install -y -q gcc >/dev/null 2>&1 || \
		(sudo apt-get update -q >/dev/null && sudo apt-get install -y -q gcc >/dev/null); \
	else echo "gcc not installed and no root: the SGLang tests will fail;" \
		"install with: sudo apt-get install -y gcc"; fi
endif

test-sglang: $(DEV) gcc
	ATROPOS_TEST_SGLANG=1 $(PY) -m pytest tests/sglang

# The whole check in throwaway venvs with the newest versions pyproject.toml's ranges allow
# (upstream's compat venvs too): run it before `make lock`, to see the next deprecation before a
# fresh machine does. It prints which versions differ from the lock. WITH="transformers==4.56.2"
# pins a release (repeatable, space-separated) to check an older end of a range the same way.
FRESH := $(PYTHON) scripts/deps.py fresh --torch '$(TORCH)' --extras '$(EXTRAS)' \
	$(foreach req,$(WITH),--with '$(req)')

test-latest: chromium slurm gcc
	$(FRESH)

# Refresh requirements/*.txt: the same run, then the lock files from exactly what passed.
lock: chromium slurm gcc
	$(FRESH) --write-lock

check: test

fmt: $(DEV)
	$(VENV)/bin/ruff format src tests benchmarks scripts
	$(VENV)/bin/ruff check --fix src tests benchmarks scripts

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache runs
