"""Text from the user's input made safe for a terminal: what a config file's keys and values, or an option's value,
carry into a line the CLI prints. A NUL byte, an escape sequence or a carriage return would be written to the terminal
as it is (an escape sequence recolours or clears it); ``printable`` writes them as Python escapes do."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with each character that is not printable (controls, a lone surrogate) written as its escape,
    ``\\x00``, ``\\x1b``, ``\\u2028``: the rest as it is (``repr`` without its quotes, and without escaping quotes)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
