"""The build pipeline: recipes and their `when` conditions, sources, patches, toolchains, the plan
and the steps that run it; upgrades, bisect and cache care, which are made of builds.  Named
`forge`, not `build`: tools and .gitignore templates take a `build/` directory for build output."""
