"""What the trainer side, the exporter's runtime and the tools agree on.

``keys`` (the canonical signal keys, their aliases and metric names), ``snapshot`` (the record
models of contract v1), ``run_layout`` (a run folder's names, files and order), ``control`` (a
run's pause record), ``samples`` (the order of a sample's responses), ``safe_io`` (opening a
file of the snapshot folder, which anyone may write into) and ``thresholds`` (every number a
card or a report verdict compares with). ``keys``, ``run_layout``, ``safe_io`` and ``samples``
use the standard library only: the SDK imports them inside a training job.
"""
