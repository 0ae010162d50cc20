"""Bundled facts, shipped as package data: GPU and interconnect datasheet figures, architecture
tables and copies of Hugging Face ``config.json`` files. Nothing here computes; ``advisor.profiles``
loads and validates these files."""
