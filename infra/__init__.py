"""Infrastructure as code: the deployment config model and the CDK stacks built from it."""
