"""The ground floor: facts every layer reads (instances, names, versions, exit codes, errors,
checkpoint layout). Imports neither torch nor the CDK."""
