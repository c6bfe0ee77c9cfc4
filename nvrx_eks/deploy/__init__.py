"""A deployed environment: the deployment, its stack outputs, the Kubernetes client, synth and the CDK CLI."""
