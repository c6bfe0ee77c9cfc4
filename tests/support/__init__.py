"""Support code the tests share: the CLI harness, the local Kubernetes API server, trainer fixtures, manifest cases."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout the tests run in."""
