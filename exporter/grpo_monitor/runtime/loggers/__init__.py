"""Readers of the files other loggers write (W&B, TensorBoard, MLflow, Trackio): each turns
what its logger appended since the last read into flat snapshot records (docs/loggers.md)."""
