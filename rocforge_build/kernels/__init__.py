"""rocforge's own HIP kernels (the .hip/.hpp sources are package data): build, run, check."""
