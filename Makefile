# Two entry points for a newcomer: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
RUN    := $(VENV)/.installed
STAMP  := $(VENV)/.installed-dev
OUT    ?= out
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo simulate check-config schema test lint typecheck imports system-deps kube pytest bench release clean

# A fresh Debian has python3 but not always its venv module: install it when missing.
# Each step says one line when it works; pip's own output (and the build backend's warnings
# about editable installs, which --quiet does not hold back) goes to $(VENV)/pip.log, printed
# whole when a step fails. The demo and the simulator need the controller and the sandbox
# only ($(RUN)); the tests and the linters add the dev tools ($(STAMP)), among them Helm's
# engine and Kubernetes' schemas for every version, which a first `make demo` need not wait for.
PIP := PIP_ROOT_USER_ACTION=ignore $(BIN)/pip --quiet --disable-pip-version-check
$(BIN)/python:
	@$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || { \
		echo "installing python3-venv (Debian)"; \
		$(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q python3-venv; }
	@$(PYTHON) -m venv $(VENV) && echo "venv: $(VENV) ($$($@ -V))"
	@$(PIP) install --upgrade pip >$(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	@echo "pip: $$($(BIN)/pip --version | cut -d' ' -f1-2)"

$(RUN): pyproject.toml sandbox/pyproject.toml | $(BIN)/python
	@$(PIP) install -e . -e ./sandbox >>$(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	@echo "installed rebalancer and rebalancer-sandbox into $(VENV) ($(VENV)/pip.log)"
	@touch $@

# One pip run for the tests: what the demo needs and the dev tools, resolved together (a second
# run over the first took 16-85 s on a clean clone); the demo's stamp goes with it.
$(STAMP): pyproject.toml sandbox/pyproject.toml | $(BIN)/python
	@$(PIP) install -e '.[dev]' -e ./sandbox >>$(VENV)/pip.log 2>&1 \
		|| { cat $(VENV)/pip.log; exit 1; }
	@echo "installed rebalancer[dev] and rebalancer-sandbox into $(VENV) ($(VENV)/pip.log)"
	@touch $@ $(RUN)

# The controller, for real, against the embedded emulated cluster: a day of traffic, as fast as it
# runs (-v: every decision, a day a minute), its summary, demo.json and the day's picture.
demo: $(RUN)
	$(BIN)/rebalancer demo --report $(OUT)/demo

# The what-if simulator on the same trace: a week, every strategy and baseline.
simulate: $(RUN)
	$(BIN)/rebalancer simulate --trace examples/traces/azure_llm_2024_week_per_minute.csv \
		--service code --tz America/Los_Angeles --out $(OUT)/simulate

# The settings under a Helm values file's `config:`, checked offline as `rebalancer check` checks a
# settings file: every setting, and every PromQL query parsed (docs/getting-started.md, step 3).
# Several files, VALUES="values.yaml overlay.yaml", merge in order as helm's -f A -f B does.
VALUES ?= values.yaml
check-config: $(STAMP)
	@mkdir -p $(OUT)
	$(BIN)/python -m tools.settings_of $(VALUES) > $(OUT)/config.yaml
	$(BIN)/rebalancer check --config $(OUT)/config.yaml

test: lint typecheck imports system-deps pytest

# The tests start a real Prometheus (Debian's prometheus brings promtool too), a throwaway
# PostgreSQL (initdb and pg_ctl, run as an unprivileged user through setpriv when root), a
# real kube-apiserver, whose service-account keys openssl makes, and real nodes: the kubelet
# (built with the control plane) over Debian's containerd and runc, the CNI bridge plugin,
# in mount namespaces of their own (unshare, nsenter), pods built from busybox's static binary.
system-deps:
	@missing=""; \
	command -v prometheus >/dev/null && command -v promtool >/dev/null || missing="prometheus"; \
	{ command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; } \
		|| missing="$$missing postgresql"; \
	command -v setpriv >/dev/null && command -v unshare >/dev/null \
		&& command -v nsenter >/dev/null || missing="$$missing util-linux"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v containerd >/dev/null && command -v ctr >/dev/null || missing="$$missing containerd"; \
	command -v runc >/dev/null || missing="$$missing runc"; \
	[ -x /usr/lib/cni/bridge ] || missing="$$missing containernetworking-plugins"; \
	dpkg -s busybox-static >/dev/null 2>&1 || missing="$$missing busybox-static"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -q && \
		$(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy's cache is kept per user beside the kube binaries, not in the checkout: on a fresh clone a
# cold cache made `make typecheck` take 62 s (28 s of CPU) on this 2-core machine, one warmed by
# another clone of the same sources 0.6 s. mypy checks each cached module against its file's
# content (its size and hash, whatever the mtime or the checkout's path), so an entry of other
# sources is never used for these: a module that changed is checked again, with what depends on
# its interface (a type error put into a fresh clone was reported with the cache warm).
MYPY_CACHE = $${XDG_CACHE_HOME:-$$HOME/.cache}/rebalancer/mypy

typecheck: $(STAMP)
	$(BIN)/mypy --cache-dir "$(MYPY_CACHE)"

imports: $(STAMP)
	$(BIN)/lint-imports

# A real kube-apiserver and etcd, kube-scheduler, kube-controller-manager and KWOK, built from
# their Go modules into ~/.cache/rebalancer once (tests/kube/build.sh; a Go toolchain is needed,
# the binaries are never committed); and kube-apiserver 1.37, the first to serve EvictionRequests
# (tests/kube/v1.37/build.sh), built here rather than inside a test worker.
kube:
	@tests/kube/build.sh >/dev/null
	@tests/kube/v1.37/build.sh >/dev/null

# Two workers per core: most of the suite's time is spent waiting on real servers and processes
# (Prometheus, PostgreSQL, kube-apiserver and the rest of a control plane, the controller under
# test), so on two cores four workers ran the suite in 474 s where two took 546 s, the load
# average staying under 2. Each worker starts the servers its tests ask for. A worker that runs
# out of tests takes some from one that still has many (`worksteal`): a handful of tests take
# 30-60 s each, and with fixed shares handed out up front a run lasts as long as its longest
# share (two runs each on the same tree: 465 s and 409 s in fixed shares, 369 s and 336 s).
# The sources compiled first: the suite starts the controller as a process some hundred times,
# and where PYTHONDONTWRITEBYTECODE is set (the machines here set it) each start would compile
# them again (0.15-0.2 s of CPU each). For the same reason no worker would keep the modules pytest
# rewrites (their asserts: the tests', tests/support's, the pytest plugins'), and each of the four
# rewrote all of them as it collected, 10 of its 14.7 s of CPU while no test ran: they are
# rewritten once, over both cores (7 s of CPU), and read by every worker
# (tests/support/rewritten.py).
pytest: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 rebalancer strategies sandbox tests >/dev/null
	$(BIN)/python -m tests.support.rewritten tests
	dir=$$(tests/kube/build.sh) && tests/kube/v1.37/build.sh >/dev/null && TESTS_KUBE_DIR="$$dir" \
		$(BIN)/pytest --numprocesses=$$(( $$(nproc) * 2 )) --dist worksteal

# The chart's schema for `config`, generated from the settings model (rebalancer/schema.py).
schema: $(RUN)
	$(BIN)/python -m rebalancer.schema

# Every artifact of this version from the checkout, into out/release: the wheel and the sdist, the
# chart packaged by Helm, the controller's image (an OCI layout tarball, built with no container
# engine) and SHA256SUMS. Refuses when pyproject.toml and Chart.yaml disagree on the version.
# Needs Helm (on the PATH, or HELM=...). Nothing is pushed: docs/design/release.md.
release: $(STAMP)
	$(BIN)/python -m tools.release --out $(OUT)/release

bench: $(STAMP)
	$(BIN)/python bench/simulate_speed.py

clean:
	rm -rf $(VENV) $(OUT) .mypy_cache .ruff_cache .pytest_cache .hypothesis
