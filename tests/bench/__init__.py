"""Tests of The resilience benchmark."""
