"""rocforge: build orchestration and environment provisioning for AMD GPUs on ROCm."""

__version__ = "0.1.0"
