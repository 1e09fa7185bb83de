"""The exporter's runtime: files in → signals → store → exposition → HTTP.

``watch`` (file events) → ``ingest`` (read and parse, every reject counted) → ``signals`` and
``forecast`` (each rank's step windows and the entropy–reward law) → ``store`` (latest values,
caps, pre-rendered lines) → ``exposition`` (text format) → ``http`` (``/metrics``, ``/replay``,
``/docs/``, the webhook). Beside the flow: ``health`` (the exporter's own series),
``collectors`` (NVML), ``rebaseline``, ``replay`` and ``runbook`` (what ``http`` serves), the
red-card path (``webhook`` and ``alertmanager_poll`` in, ``card_pause`` → the pause record,
``notify`` out to people), ``web_config`` (TLS and auth), ``config`` and ``app`` (assembly).
"""
