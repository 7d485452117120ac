"""clusterrun: launch one PyTorch training script on many machines over SSH."""

__version__ = "0.1.0"
