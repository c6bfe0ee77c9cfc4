"""Tests of Job manifests: rendering, golden files, validation, and the job commands against a test API server."""
