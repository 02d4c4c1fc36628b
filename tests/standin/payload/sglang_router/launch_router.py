"""``python -m sglang_router.launch_router``: the stand-in router (sglang_standin.router)."""

from sglang_standin.router import main

if __name__ == "__main__":
    main()
