"""Byte and time formatting shared by every view (the engine keeps integers; views format)."""

from __future__ import annotations

GiB = 1024**3
MiB = 1024**2
GB = 1000**3


def fmt_bytes(n: float, significant: int | None = None) -> str:
    """Human bytes in binary units, the way nvidia-smi and torch report them; `significant`: that many digits
    (470 MiB, 14.2 MiB) where two decimals take too much room, whole units from 10**significant up."""
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            v = n / size
            text = f"{v:.2f}" if significant is None else f"{v:.{significant}g}" if v < 10**significant else f"{v:.0f}"
            return f"{sign}{text} {unit}"
    return f"{sign}{int(n)} B"


def counted(n: int, noun: str) -> str:
    """'1 GPU', '8 GPUs', '2 processes'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


def fmt_seconds(s: float) -> str:
    s = float(s)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.2f} h"
    return f"{s / 86400:.1f} d"


def fmt_count(n: int) -> str:
    return f"{n:,}"


def fmt_params(n: int) -> str:
    """A parameter count in the unit that shows it: 7.62B, 229.7M, 230K (a tiny test model is not "0.00B")."""
    if n >= 10**9:
        return f"{n / 1e9:.2f}B"
    if n >= 10**6:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e3:.0f}K"


def printable(text: object) -> str:
    """Text safe to print on a terminal: every control, format (bidi) or other non-printable character shown as its
    escape (\\x1b, \\u202e), so a log's or a file's bytes cannot set the title, clear the screen or reach the
    clipboard (OSC 52)."""
    s = str(text)
    return s if s.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in s)
