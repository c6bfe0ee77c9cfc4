"""Infrastructure as code: the deployment config, the add-on catalog, pod security and the CDK stacks."""
