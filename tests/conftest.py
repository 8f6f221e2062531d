"""Shared fixtures; services (Redis, S3) and the model are started by the fixtures needing them."""
