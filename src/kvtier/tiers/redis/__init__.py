"""The shared Redis/Valkey tier (``redis://``, ``rediss://``, ``valkey://``): the tier in
``tier``, its options in ``options``, so that reading the options needs no client library."""
