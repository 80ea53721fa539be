# nemo_topr: the two commands a new user runs are `make demo` and `make test`.
# Both create .venv (Python 3.12, pinned requirements) when it is missing.
SHELL := /bin/bash
PYTHON := .venv/bin/python
PYTEST_ARGS ?=
# Run serially, the suite leaves the 2 cores 35% idle (imports, Megatron's start-up, Slurm waits),
# so `make test` runs it on pytest-xdist workers; each test module, and all the real-Slurm modules,
# stay on one worker (tests/conftest.py). TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
# each test's time (set-up and tear-down included) in JUnit XML, CI's artefact; the slowest 30 printed
TIMES = --durations=30 --junitxml=runs/pytest/$@.xml

.PHONY: venv test test-fast demo clean bench miniature miniature-study miniature-study2 miniature-study3

venv:
	@scripts/setup_venv.sh

test: venv
	$(PYTHON) -m pytest $(XDIST) $(TIMES) $(PYTEST_ARGS)

test-fast: venv
	$(PYTHON) -m pytest $(XDIST) $(TIMES) -m "not slow" $(PYTEST_ARGS)

demo: venv
	$(PYTHON) -m nemo_topr.demo

clean:
	rm -rf runs .pytest_cache

# The CPU miniature of the paper's claims (docs/miniature.md): about 16 minutes on 2 cores.
miniature: venv
	$(PYTHON) -m nemo_topr.miniature

# The pre-registered study of issue 19 (docs/miniature.md): 67 minutes on 2 cores (3,991 s, 2026-11-23); add ARGS=--dry-run for the plan.
miniature-study: venv
	$(PYTHON) -m nemo_topr.miniature.study $(ARGS)

# Study 2 of issue 32 (docs/miniature/study2_preregistration.md): 73 minutes on 2 cores (4,357 s, 2026-11-25); ARGS=--dry-run, ARGS=--resume.
miniature-study2: venv
	$(PYTHON) -m nemo_topr.miniature.study --design study2 $(ARGS)

# Study 3 of issue 96 (docs/miniature/study3_preregistration.md): about 2 hours on 2 idle cores (the registered
# budget); ARGS=--dry-run prints the plan and the estimate, ARGS=--resume continues an interrupted study.
miniature-study3: venv
	$(PYTHON) -m nemo_topr.miniature.study --design study3 $(ARGS)

bench: venv
	$(PYTHON) -m bench.run
