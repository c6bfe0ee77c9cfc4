"""The training workload: the resilient FSDP2 trainer that runs in the container and on a laptop.

The light modules (config, presets, faults, launch, process_state, events) import no torch, so
the operator CLI validates trainer configs and renders launcher commands quickly; the training
modules (train -> trainer -> training, checkpoint/, model, data) import torch.
"""
