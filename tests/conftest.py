"""Shared fixtures. Services (Redis, S3) and the model are started/loaded by fixtures that need them."""
