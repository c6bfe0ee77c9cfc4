"""The operator CLI, `nvrx-eks`: one console script, one module per command group."""
