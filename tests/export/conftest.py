"""Fixtures for the export tests (shared plans live in export_plans.py)."""

from __future__ import annotations

import socket

import pytest


@pytest.fixture
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
