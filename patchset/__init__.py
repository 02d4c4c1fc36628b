"""patchset: a quilt-style patch queue for inference-server forks."""

__version__ = "0.1.0"
