"""Shipping what was built: container images and the shared-library closure they carry."""
