"""Byte units, defined once. Estimators work in integer bytes; these convert at the edges."""

GIB = 2**30
MIB = 2**20
GB = 1e9  # decimal: bandwidths in GB/s, as datasheets state them
TFLOPS = 1e12  # datasheet peaks


def gib(n_bytes: float) -> float:
    """Bytes as GiB (for display and for options given in GiB)."""
    return n_bytes / GIB
