"""The shared Mooncake Store tier (``mooncake://master:port?metadata_server=...``): the tier in
``tier``, its options in ``options``, so that reading the options needs no client library."""
