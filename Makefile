# grpo-monitor: the two commands of the README, and the helpers they use.
#   make demo   the exporter on a temporary folder, fed a built-in synthetic run
#   make test   everything the tests need (virtualenv, Python packages, Debian's prometheus),
#               then the whole suite
# Set-up installs only what is missing, so a warm machine starts at once.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# torch is pinned to the CPU wheel this kind of machine keeps on disk; an unpinned torch would
# pull a multi-GB CUDA build. The exporter itself never needs torch.
TORCH  ?= torch==2.13.0
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test deps system-deps bench docs check-docs clean

demo: deps system-deps
	$(PY) -m grpo_monitor.cli demo $(ARGS)

test: deps system-deps
	$(PY) -m pytest $(PYTEST_ARGS)

deps: $(STAMP)

$(STAMP): pyproject.toml
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check '$(TORCH)'
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

# The tests run the real prometheus, promtool, prometheus-alertmanager and amtool, and check
# docker-compose.yml with docker-compose (no Docker engine needed); the benchmarks compare with
# node_exporter's textfile collector.
system-deps:
	@command -v promtool >/dev/null && command -v prometheus-alertmanager >/dev/null && \
	  command -v amtool >/dev/null && command -v prometheus-node-exporter >/dev/null && \
	  command -v docker-compose >/dev/null || \
	  { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	  prometheus prometheus-alertmanager prometheus-node-exporter docker-compose; }

bench: deps system-deps
	$(PY) bench/bench_writer.py
	$(PY) bench/bench_latency.py
	$(PY) bench/bench_scrape.py
	$(PY) bench/bench_alert_latency.py

docs: deps
	$(PY) -m grpo_monitor.metrics_doc > docs/metrics.md
	$(PY) -m grpo_monitor.thresholds > prometheus/rules/grpo-thresholds.yml

clean:
	rm -rf $(VENV) .pytest_cache
