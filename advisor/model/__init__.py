"""Model inputs: ``ModelSpec``, the one resolver (bundled id, local config, Hub, size, live module),
exact parameter counts from a config (no torch) and from a module (``meta``, torch imported lazily)."""
