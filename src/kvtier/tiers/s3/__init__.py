"""The shared S3 tier (``s3://bucket/prefix?endpoint=...``): the tier in ``tier``, its options
in ``options``, so that reading the options needs no client library."""
