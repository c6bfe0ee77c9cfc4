"""How often a job checkpoints and what its faults cost: the goodput model (model.py), two
checkpoint tiers (two_tier.py) and hot spares at scale (spares.py). Numbers only: `nvrx-eks plan`
(nvrx_eks/ops/plan.py) prints them, the job summary and a default job's interval read them. No
torch, no console, nothing above nvrx_eks.deploy."""
