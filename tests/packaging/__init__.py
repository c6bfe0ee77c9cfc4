"""Tests of the distribution: the wheel built from the repository, its package data and declared dependencies."""
