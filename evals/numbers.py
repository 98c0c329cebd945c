"""How every report writes a number: the CLI table, JUnit, release markdown and summaries, alert
messages, run summaries and the dashboard's pages.

One rule, so that the same value reads the same everywhere: four decimals, or four significant
digits below 1e-3 and from 1e6 on. A drift KL of 4.03e-06 nats is not "0.0000", and a
non-finite drift's placeholder severity of 1e30 is not 31 digits. Integers (counts) stay whole.
Imports nothing beyond the standard library: the client (`pip install kvcanary`) uses it too.
"""

from __future__ import annotations

DECIMALS = 4
SMALL, LARGE = 1e-3, 1e6


def format_number(value: float | None, digits: int = DECIMALS, missing: str = "-") -> str:
    """`value` in `digits` decimals, or `digits` significant digits where decimals would hide it
    (below 1e-3) or drown it (from 1e6 on); `missing` for None; an int as it is."""
    if value is None:
        return missing
    if isinstance(value, int):
        return str(value)
    magnitude = abs(value)
    return f"{value:.{digits}g}" if 0 < magnitude < SMALL or magnitude >= LARGE else f"{value:.{digits}f}"


def format_signed(value: float, digits: int = DECIMALS) -> str:
    """A change, with its sign: `+0.0125`, `-3.1e-05`, `0.0000`."""
    return ("+" if value > 0 else "") + format_number(value, digits)
