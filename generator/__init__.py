"""ddp-new: render a PyTorch DistributedDataParallel training project from a copier template."""

__version__ = "0.9.0"
