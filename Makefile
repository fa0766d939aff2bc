# pypto developer entry points.  Everything runs inside .venv (made by scripts/bootstrap.sh).
SHELL  := /bin/bash
VENV   := .venv
PYTHON := $(VENV)/bin/python

# JupyterLab: listen on loopback only; no browser on a headless machine; root needs --allow-root.
LAB_FLAGS := --notebook-dir=. --LabApp.default_url=/lab/tree/tutorials/00_tour.ipynb --ip=127.0.0.1 --LabApp.news_url=None \
             --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate
ifeq ($(strip $(DISPLAY)),)
LAB_FLAGS += --no-browser
endif
ifeq ($(shell id -u),0)
LAB_FLAGS += --allow-root
endif

# --nbval only collects *.ipynb; the .py tests are collected by pytest as usual.
# --nbval-current-env runs the notebooks on a kernel started with .venv's python
# (sys.executable), whatever kernelspec name the notebooks' metadata carries.
NBVAL_FLAGS := --nbval --nbval-current-env --nbval-sanitize-with tutorials/nbval_sanitize.cfg

.PHONY: install lab test bench tutorials fuzz fuzz-grad clean distclean

install:
	bash scripts/bootstrap.sh

lab: install
	$(PYTHON) scripts/lab_setup.py
	$(VENV)/bin/jupyter lab $(LAB_FLAGS)

test: install
	$(PYTHON) -m pytest tests tutorials notebooks $(NBVAL_FLAGS) -q

tutorials: install
	$(PYTHON) scripts/run_tutorials.py

bench: install
	$(PYTHON) benchmarks/run.py
	$(PYTHON) benchmarks/first_kernels.py
	$(PYTHON) benchmarks/hbm_efficiency.py
	$(PYTHON) benchmarks/compile_time.py
	$(PYTHON) benchmarks/check_speed.py
	$(PYTHON) benchmarks/dynamic_shapes.py
	$(PYTHON) benchmarks/cost_fidelity.py
	$(PYTHON) benchmarks/tune.py
	$(PYTHON) benchmarks/nn.py

# Differential fuzzing (tests/fuzz): `make fuzz SEEDS=1000 BUDGET=1800 [SEED=first] [DYNAMIC_EVERY=K]`;
# SEEDS=0 runs until the budget (seconds); without SEED a fresh random first seed; DYNAMIC_EVERY:
# the dynamic-shape stage on one correct case in K (default 4; 1 = all, 0 = none).  Minimal
# failing kernels go to artifacts/fuzz/.
SEEDS  ?= 0
BUDGET ?= 1800
fuzz: install
	$(PYTHON) scripts/fuzz.py --seeds $(SEEDS) --budget $(BUDGET) $(if $(SEED),--seed $(SEED)) \
		$(if $(DYNAMIC_EVERY),--dynamic-every $(DYNAMIC_EVERY))

# The gradient stage: pypto.grad of the generator's fp32 kernels against float64 differences
# (`make fuzz-grad SEED=first SEEDS=count`; tests/fuzz/grad.py).
fuzz-grad: install
	cd tests && ../$(PYTHON) fuzz/grad.py $(or $(SEED),1000000) $(if $(filter 0,$(SEEDS)),5000,$(SEEDS))

clean:
	rm -rf build dist artifacts .pytest_cache *.egg-info
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -print0 \
		| xargs -0 -r rm -rf

distclean: clean
	rm -rf $(VENV)
