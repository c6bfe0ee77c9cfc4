"""Tests of Bad input at the CLI: named field, exit 2, no traceback."""
