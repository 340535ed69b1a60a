"""Verified builds shared through stores: OCI registries, OCI image layouts on disk, plain HTTP
and S3, keyed by the inputs that decide the bytes, signed, and verified again where they land."""
