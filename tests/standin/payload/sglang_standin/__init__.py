"""Stand-in for SGLang's server processes on test hosts (tests only; stdlib only).

Installed into a venv next to the real SGLang source tree by
``tests/standin/install.py``; see server.py (``python -m sglang.launch_server``),
router.py (``python -m sglang_router.launch_router``), derive.py (what is read
from the pinned source) and chat.py (answers and faults).
"""
