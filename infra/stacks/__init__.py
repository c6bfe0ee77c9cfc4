"""The CloudFormation stacks of one deployment (network, storage, cluster), their composition and cdk-nag."""
