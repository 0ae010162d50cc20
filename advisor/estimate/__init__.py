"""Pure estimators: activations, per-GPU memory and step time, as functions of validated inputs.
No torch, no file access beyond the bundled profiles, no environment reads (a test checks)."""
