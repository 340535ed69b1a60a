"""Builds from recipes: recipes, conditions, sources, patches, toolchains, plan, pipeline."""
