"""Infrastructure as code: the deployment config (config/, profiles/), the add-on catalog, pod
security, and the CDK stacks (stacks/) built from the constructs (constructs/)."""
