"""Tests of Preflight, teardown, planning and the GPU smoke test."""
