"""Tests of CDK stacks, add-ons, versions and security gates."""
