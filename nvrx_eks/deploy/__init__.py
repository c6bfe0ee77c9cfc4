"""A deployed environment: the validated deployment, its stack outputs, the Kubernetes client, and offline synth."""
