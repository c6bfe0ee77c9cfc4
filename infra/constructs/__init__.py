"""The pieces the stacks compose: GPU nodes, add-ons, FSx volume, trainer image, secure defaults."""
