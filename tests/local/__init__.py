"""Tests of Local runs, reports, data preparation and the demo."""
