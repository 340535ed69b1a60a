"""TheRock nightlies: listings from the configured sources, and safe installs under a prefix."""
