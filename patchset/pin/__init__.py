"""The pin and upstream: the pinned SGLang (model), its rules (pinrules), provisioning and
caching its source from PyPI or git (upstream, basebundle) and where it lives (paths)."""
