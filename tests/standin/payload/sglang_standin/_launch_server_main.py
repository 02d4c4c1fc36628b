"""Executed as ``sglang.launch_server`` (``__main__``) by the stand-in's import hook."""

from sglang_standin import server

if __name__ == "__main__":
    server.main()
