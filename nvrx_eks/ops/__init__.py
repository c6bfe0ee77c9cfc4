"""Operating a deployment: preflight checks, teardown, goodput planning, and the GPU smoke test."""
