"""Searching for a culprit: bisect over the series, group testing over the ranking, and a
host's restorable state (save, converge, restore) that bisect and rollout share."""
