"""The training workload: the resilient FSDP2 trainer that runs in the container and on a laptop.

This package must stay importable without torch for the light modules (config, errors) so the
operator CLI can validate trainer configs quickly; only the training modules import torch.
"""
