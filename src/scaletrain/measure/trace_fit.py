"""The trace's fits: bytes as c0 + c1·S + c2·S² with non-negative coefficients, exact where the bytes are, checked
where they are not (measure/trace.py)."""

from __future__ import annotations

import math
from fractions import Fraction


class TraceError(Exception):
    """A trace that cannot run: the message is the one line the engine shows."""


def _solve(points: list[tuple[Fraction, Fraction]], free: tuple[int, ...]) -> list[Fraction] | None:
    """Least squares of bytes = Σ c_k·S^k over the powers in `free` (normal equations, exact fractions)."""
    n = len(free)
    a = [[sum(x ** (free[i] + free[j]) for x, _ in points) for j in range(n)] for i in range(n)]
    b = [sum(y * x ** free[i] for x, y in points) for i in range(n)]
    for col in range(n):                       # Gauss-Jordan
        piv = next((r for r in range(col, n) if a[r][col] != 0), None)
        if piv is None:
            return None
        a[col], a[piv], b[col], b[piv] = a[piv], a[col], b[piv], b[col]
        for r in range(n):
            if r != col and a[r][col] != 0:
                f = a[r][col] / a[col][col]
                a[r] = [u - f * v for u, v in zip(a[r], a[col])]
                b[r] -= f * b[col]
    c = [Fraction(0)] * 3
    for i, k in enumerate(free):
        c[k] = b[i] / a[i][i]
    return c


def up(x: Fraction) -> int | float:
    """A coefficient as the answer stores it: exact when whole, else rounded up at a thousandth of a byte."""
    return int(x) if x.denominator == 1 else math.ceil(x * 1000) / 1000


def envelope(points: list[tuple[int, int]], quadratic: bool = True) -> list[int | float]:
    """c0, c1, c2 ≥ 0 never under any point: `envelope_parts`' fit with the shorter lengths' shortfall in c0."""
    c, below = envelope_parts(points, quadratic)
    return [up(Fraction(c[0]) + below), *c[1:]] if below else c


def envelope_parts(points: list[tuple[int, int]], quadratic: bool = True) -> tuple[list[int | float], int | float]:
    """c0, c1, c2 ≥ 0 over the three LONGEST lengths: the best non-negative fit through them, raised by the largest
    shortfall at any of them (MoE routing of a random init moves a few tokens from one length to the next); and the
    largest shortfall of that fit at a SHORTER length, which a length below the three longest adds to c0. For the
    rise of live bytes in a layer's forward or backward: a maximum over moments, and at a short length another
    moment than at a long one may be the highest (doge's checkpointed backward at 64 tokens), which a fit through
    the short lengths would bend into a constant and too small a slope, under at every longer length; raising the
    constant at every length put vaultgemma's checkpointed LoRA 6.8 % over at 128 tokens, where the long fit is
    exact. Never under what was measured at a length in its range."""
    pts = sorted(points)
    longest, shorter = pts[-3:], pts[:-3]
    c = fit(longest, "rise", slack=1 << 62, quadratic=quadratic)
    at = lambda x: sum(Fraction(v) * Fraction(x) ** k for k, v in enumerate(c))      # noqa: E731
    short = max((Fraction(y) / Fraction(at(x)) for x, y in longest if y > 0 and at(x) > 0), default=Fraction(1))
    extra = max((y - at(x) for x, y in longest if at(x) <= 0), default=0)
    if short > 1:
        c = [up(Fraction(v) * short) for v in c]
    if extra > 0:
        c[0] = up(Fraction(c[0]) + extra)
    below = max((y - at(x) for x, y in shorter), default=0)
    return c, (up(Fraction(below)) if below > 0 else 0)


def fit(points: list[tuple[int, int]], what: str = "bytes", slack: int = 0, quadratic: bool = True) -> list[int]:
    """c0, c1, c2 ≥ 0 of bytes = c0 + c1·S + c2·S² through the first three (S, bytes) points (exact where the bytes
    are a quadratic with non-negative coefficients, else the best non-negative least-squares fit), rounded up; every
    point must then be within `slack` bytes, or the trace refuses."""
    pts = [(Fraction(a), Fraction(b)) for a, b in points]
    fitting, check = pts[:3], pts[3:]
    best = None
    for free in ((0, 1, 2), (0, 1), (1, 2), (0, 2), (1,), (2,), (0,)) if quadratic else ((0, 1), (1,), (0,)):
        c = _solve(fitting, free)
        if c is None or any(x < 0 for x in c):
            continue
        err = sum((c[0] + c[1] * x + c[2] * x * x - y) ** 2 for x, y in fitting)
        if best is None or err < best[0]:
            best = (err, c)
        if err == 0:
            break
    coeffs = [up(x) for x in best[1]] if best else [0, 0, 0]
    for x, y in fitting + check:
        got = coeffs[0] + coeffs[1] * x + coeffs[2] * x * x
        if abs(got - y) > max(slack, 0):
            raise TraceError(f"{what}: saved bytes {[int(v) for _, v in pts]} at S={[int(u) for u, _ in pts]} are "
                             f"not c0 + c1·S + c2·S² with c ≥ 0 (off by {int(abs(got - y))} bytes at S={int(x)})")
    return coeffs


