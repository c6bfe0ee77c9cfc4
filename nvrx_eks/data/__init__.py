"""Training data: text to token shards (`nvrx-eks data prepare`) and their upload to S3."""
