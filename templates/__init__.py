"""The Jinja templates of the job manifests, installed as the package data nvrx_eks.templates."""
