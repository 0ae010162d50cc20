"""Simulation: run the planned training step in PyTorch on fake tensors under a fake process group,
measure each rank's peak, and compare with the estimate. Imports torch and ``wrappers`` (it runs
the same recipe ``wrap()`` runs)."""
