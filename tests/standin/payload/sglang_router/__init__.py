"""Stand-in for the ``sglang_router`` package (tests only): see sglang_standin.router."""

__version__ = "0.0.0+standin"
