"""The pieces the stacks compose: GPU node group and its user data, add-ons, FSx volume, trainer
image, and resources with the security defaults (keys, buckets)."""
