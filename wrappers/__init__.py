"""Apply a plan's strategy to a live model (``wrap``). Torch is imported here, never in ``advisor``."""
