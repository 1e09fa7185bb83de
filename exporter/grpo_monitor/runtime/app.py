"""The exporter assembled: store, ingestion, watcher, GPU collector, HTTP server, and the
red-card inputs."""

from __future__ import annotations

import dataclasses

from prometheus_client import generate_latest

from grpo_monitor.runtime.card_pause import CardPauser, ScrapePace
from grpo_monitor.runtime.collectors.gpu import GPUCollector
from grpo_monitor.runtime.config import ExporterConfig
from grpo_monitor.runtime.health import ExporterHealth
from grpo_monitor.runtime.http import ExporterServer
from grpo_monitor.contract.key_map import KeyMap, KeyMapError
from grpo_monitor.runtime.ingest import Ingestor
from grpo_monitor.runtime.saved_state import StateFile
from grpo_monitor.runtime.store import RunStore
from grpo_monitor.runtime.watch import SnapshotWatcher
from grpo_monitor.runtime.web_config import load_web_config


class Exporter:
    def __init__(self, config: ExporterConfig) -> None:
        self.config = config
        # First: a web configuration that cannot be used stops the start-up before anything
        # runs (WebConfigError is a ValueError: `serve` prints its one line and exits 2).
        web = load_web_config(config.web_config_file) if config.web_config_file is not None else None
        self.store = RunStore(config.limits)
        self.health = ExporterHealth()
        # The tree every reader stays in (safe_io), resolved once: a link the folder's path goes
        # through is followed now, as its owner set it up, and a link swapped in later is not.
        root = config.snapshot_dir.resolve()
        if config.storage_path is not None and config.storage_path.resolve().is_relative_to(root):
            # Anyone who writes snapshots could then place a state file (saved_state.py).
            raise ValueError(f"--storage.path {config.storage_path} lies in the snapshot folder; "
                             "give the exporter a folder of its own")
        try:
            key_map = KeyMap.load(config.key_map_file) if config.key_map_file is not None else None
        except (OSError, KeyMapError) as exc:
            raise ValueError(f"--snapshot.key-map: {exc}") from None
        self.ingestor = Ingestor(
            root, self.store, self.health,
            max_file_bytes=config.max_file_bytes, max_line_bytes=config.max_line_bytes,
            key_map=key_map, backfill_above_bytes=config.backfill_above_bytes)
        self.watcher = SnapshotWatcher(
            self.ingestor, poll=config.poll, poll_interval=config.poll_interval,
            rescan_interval=config.rescan_interval, run_timeout=config.run_timeout,
            state=(StateFile(config.storage_path, root, {
                "limits": dataclasses.asdict(config.limits), "key_map": config.key_map_file})
                if config.storage_path is not None else None),
            save_interval=config.storage_save_interval)
        self.gpu = (GPUCollector(config.gpu_interval, nvml=config.gpu_nvml, registry=self.health.registry)
                    if config.gpu_collector else None)
        # A red card's pause record, from the webhook or the Alertmanager poll; it knows how
        # often Prometheus scrapes (metrics()) to date the last healthy checkpoint.
        self.scrape_pace = ScrapePace()
        self.pauser = CardPauser(root, self.store, self.scrape_pace,
                                 self.health)
        self.webhook = None
        if config.webhook_token_file is not None:
            from grpo_monitor.runtime.webhook import WebhookHandler

            notifier = None
            if config.notify_url:
                from grpo_monitor.runtime.notify import Notifier, sinks

                notifier = Notifier(sinks(config.notify_url), self.store.max_step)
            self.webhook = WebhookHandler(root, config.webhook_token_file,
                                          self.store, self.health.registry, notifier=notifier,
                                          pauser=self.pauser)
        elif config.notify_url:
            # The relay rides on Alertmanager's webhook: without it nothing would ever be sent.
            raise ValueError("--notify.url needs --web.webhook-token-file (the webhook it relays)")
        self.poller = None
        if config.alertmanager_url:
            from grpo_monitor.runtime.alertmanager_poll import AlertmanagerPoller

            self.poller = AlertmanagerPoller(config.alertmanager_url, config.alertmanager_poll_interval,
                                             self.pauser, self.health.registry)
        self.server = ExporterServer(
            config.listen_address, self.metrics, self.watcher.ready.is_set, self.webhook,
            replay_dir=root if config.enable_replay else None,
            web=web, read_timeout=config.read_timeout, max_connections=config.max_connections,
            registry=self.health.registry)

    @property
    def url(self) -> str:
        return self.server.url

    def metrics(self) -> bytes:
        """One scrape: the run families (pre-rendered) and the exporter's own health."""
        self.scrape_pace.seen()
        body = "".join(self.store.render()).encode()
        return body + generate_latest(self.health.registry)

    def start(self) -> "Exporter":
        if self.gpu is not None:
            self.gpu.start()
        self.watcher.start()
        self.server.start()
        if self.poller is not None:
            self.poller.start()
        return self

    def stop(self) -> None:
        if self.poller is not None:
            self.poller.stop()
        self.server.stop()
        self.watcher.stop()
        if self.gpu is not None:
            self.gpu.stop()

    def __enter__(self) -> "Exporter":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
