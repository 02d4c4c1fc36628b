"""Making and moving a series: start one (newseries), import and export (interop), capture
a hand edit (capture), adopt a running fork (adopt), rebase onto upstream (rebase,
rebasecheck). Used by the CLI only."""
