"""Tests of The trainer: units, and multi-process runs on CPU with injected faults."""
