"""Verified builds shared through stores: OCI registries, OCI image layouts on disk, plain HTTP
and S3, keyed by the inputs that decide the bytes, signed, and verified again where they land."""


def from_stores(plan, staging, say):
    """The stores asked for the plan's build (substitute/pull.py), imported only when some
    store is configured: a machine that shares nothing needs none of its libraries (PyCA
    cryptography, oras-py), as a Debian chroot building with its own Python does."""
    from rocforge_build.substitute import pull

    return pull.attempt(plan, staging, say)
