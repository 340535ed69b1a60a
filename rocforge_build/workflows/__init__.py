"""Workflows on finished builds, above the pipeline and the measuring rooms: upgrade and rollback,
bisect and its report, the nightly gate."""
