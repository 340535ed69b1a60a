"""Discovery: GPUs, ROCm installs and rocforge builds here; the one resolver; the env output."""
