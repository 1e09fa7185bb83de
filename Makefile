# grpo-monitor: the two commands of the README, and the helpers they use.
#   make demo   the native stack on a temporary folder, fed a built-in synthetic run; installs
#               the package alone (no torch, trl, transformers or matplotlib) and Debian's
#               prometheus and prometheus-alertmanager
#               (`make demo ARGS=--trainer`: the tiny real trainer instead, and the torch extra)
#   make test   everything the tests need (virtualenv with every extra, the loggers' own
#               libraries in .venv-loggers, Debian's prometheus tools, docker-compose, and
#               podman, runc, debootstrap for the compose stack in real containers), then the
#               whole suite
#   make dist   the wheel, in dist/: `pip install 'dist/grpo_monitor-VERSION-py3-none-any.whl[trl]'`
#               in a trainer's environment (docs/sdk.md#install)
# Set-up installs only what is missing, so a warm machine starts at once.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The package alone, as `pip install .` gives it: what `make demo` needs.
BASE_STAMP := $(VENV)/.installed-base
# torch is pinned to the CPU wheel this kind of machine keeps on disk; an unpinned torch would
# pull a multi-GB CUDA build. The exporter itself never needs torch.
TORCH  ?= torch==2.13.0
# The torch extra (make demo ARGS=--trainer): torch held to $(TORCH) by a constraint, whatever
# else asks for it.
TORCH_STAMP := $(VENV)/.installed-torch
CONSTRAINT  := $(VENV)/torch-constraint.txt
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
DIST   ?= dist

.PHONY: demo test deps loggers-deps demo-deps system-deps stack-deps bench docs check-docs clean dist

demo: demo-deps stack-deps
	$(PY) -m grpo_monitor.cli demo $(ARGS)

# The suite in TEST_WORKERS processes (pytest-xdist), a test file to a worker: most of its time
# is spent waiting on real servers, containers and trainers, so three workers on a 2-core
# machine take about a third of the serial time. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 3
test: deps system-deps loggers-deps
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

deps: $(STAMP)

# The loggers' own libraries (W&B, TensorBoard, MLflow, Trackio) in a virtualenv of their own:
# the suite writes runs through them (tests/loggers/write_run.py) and reads what they leave.
LOGGERS_VENV  := .venv-loggers
LOGGERS_STAMP := $(LOGGERS_VENV)/.installed
loggers-deps: $(LOGGERS_STAMP)

$(LOGGERS_STAMP): tests/loggers/requirements.txt
	[ -x $(LOGGERS_VENV)/bin/python ] || $(PYTHON) -m venv $(LOGGERS_VENV)
	$(LOGGERS_VENV)/bin/python -m pip install -q --disable-pip-version-check -r $<
	touch $@

# The package alone; with ARGS=--trainer the torch extra too.
demo-deps: $(BASE_STAMP) $(if $(findstring --trainer,$(ARGS)),$(TORCH_STAMP))

$(BASE_STAMP): pyproject.toml
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e .
	touch $@

$(CONSTRAINT): $(BASE_STAMP)
	echo '$(TORCH)' > $@

$(TORCH_STAMP): $(BASE_STAMP) $(CONSTRAINT)
	$(PY) -m pip install -q --disable-pip-version-check -c $(CONSTRAINT) -e '.[torch]'
	touch $@

$(STAMP): $(TORCH_STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -c $(CONSTRAINT) -e '.[test]'
	touch $@

# The wheel a trainer's environment installs (no index holds grpo-monitor). Built by pip in an
# isolated environment from the checkout; it carries the runbook and the stack's configuration.
dist:
	$(PYTHON) -m pip wheel -q --disable-pip-version-check --no-deps -w $(DIST) .
	@ls $(DIST)/grpo_monitor-*.whl

# The native stack's servers (make demo).
stack-deps:
	@command -v prometheus >/dev/null && command -v prometheus-alertmanager >/dev/null || \
	  { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	  prometheus prometheus-alertmanager; }

# The tests run the real prometheus, promtool, prometheus-alertmanager and amtool, and the
# second rule engine: victoria-metrics, vmagent and vmalert (Debian's victoria-metrics); the compose
# test runs docker-compose.yml in real containers: Debian's docker-compose against podman (with
# runc; netavark, aardvark-dns and iptables for its networks), on base images that debootstrap
# builds (tests/containers.py). The benchmarks compare with node_exporter's textfile collector.
SYSTEM_TOOLS := promtool prometheus-alertmanager amtool prometheus-node-exporter docker-compose \
                podman runc debootstrap iptables netavark aardvark-dns vmalert
SYSTEM_PKGS  := prometheus prometheus-alertmanager prometheus-node-exporter docker-compose \
                podman runc debootstrap iptables netavark aardvark-dns ca-certificates \
                victoria-metrics
system-deps:
	@missing=; for t in $(SYSTEM_TOOLS); do \
	  command -v $$t >/dev/null || [ -x /usr/lib/podman/$$t ] || missing="$$missing $$t"; done; \
	  [ -z "$$missing" ] || { echo "installing Debian packages for:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	  $(SYSTEM_PKGS); }

bench: deps system-deps loggers-deps
	$(PY) bench/bench_writer.py
	$(PY) bench/bench_latency.py
	$(PY) bench/bench_scrape.py
	$(PY) bench/bench_alert_latency.py
	$(PY) bench/bench_pause.py
	$(PY) bench/bench_soak.py
	$(PY) bench/bench_folder_burst.py
	$(PY) bench/bench_forecast.py
	$(PY) bench/bench_cards.py
	$(PY) bench/bench_real_runs.py
	$(PY) bench/bench_ingest.py
	$(PY) bench/bench_timeline.py
	$(PY) bench/bench_restart.py
	$(PY) bench/bench_rules.py
	$(PY) bench/bench_save_scrape.py --ranks 1024
	$(PY) bench/bench_loggers.py
	$(PY) bench/bench_report_rollbacks.py
	$(PY) bench/bench_abuse.py

docs: deps
	$(PY) -m grpo_monitor.tools.metrics_doc > docs/metrics.md
	$(PY) -m grpo_monitor.tools.module_map > docs/modules.md
	$(PY) -m grpo_monitor.contract.thresholds > prometheus/rules/grpo-thresholds.yml
	$(PY) -m grpo_monitor.contract.cards > prometheus/rules/grpo-coverage.yml
	$(PY) -m grpo_monitor.tools.coverage_doc > docs/coverage.md
	$(PY) -m grpo_monitor.tools.frameworks_doc > docs/frameworks.md
	$(PY) -m grpo_monitor.tools.runbook_index --write
	$(PY) -m grpo_monitor.tools.state_format_doc --write
	$(PY) -m grpo_monitor.contract.card_logic --write
	$(PY) -m grpo_monitor.tools.victoriametrics --write

clean:
	rm -rf $(VENV) .pytest_cache build $(DIST)
