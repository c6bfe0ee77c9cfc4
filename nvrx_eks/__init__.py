"""nvrx-eks, the operator side: the `nvrx-eks` CLI and its commands, over a ground floor of facts."""
