"""Bundled facts, shipped as package data: GPU and interconnect datasheet figures, architecture
tables and copies of Hugging Face ``config.json`` files. Nothing here computes:
``advisor.hardware.catalog`` and ``advisor.model.bundled`` load and validate these files."""

from pathlib import Path

PROFILES_DIR = Path(__file__).parent
MODELS_DIR = PROFILES_DIR / "models"
