"""Training jobs: the JobSpec, its rendering into manifests, offline validation, and the
commands against a live cluster."""
