"""The series: patches.yaml and patches/ as typed records (model), their loader and strict
checks (manifest, patchfile, factnames), and the choice of a subset (selection)."""
