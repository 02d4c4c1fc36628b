"""Source analysis on the pinned tree: which call paths reach a patched function and
under which conditions (callpath), and the guards derived from them (guards)."""
