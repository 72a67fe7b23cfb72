"""Human units at the edge: parse "70B", "15T", "80GiB", "400Gb/s", "$2.5M", "30d".

Every parser returns SI base units (counts, bytes, bytes/s, FLOP/s, dollars,
seconds) and raises ``UnitError`` with the accepted forms on bad input. The
formatters are the inverse for reports.
"""
from __future__ import annotations

import math
import re

__all__ = [
    "UnitError",
    "parse_count",
    "parse_bytes",
    "parse_bandwidth",
    "parse_flops",
    "parse_money",
    "parse_duration",
    "parse_slurm_time",
    "format_bytes",
    "format_count",
    "format_seconds",
    "format_money",
    "round_sig",
]


class UnitError(ValueError):
    """A value that does not parse; ``expected`` lists the accepted forms."""

    def __init__(self, message: str, expected: str):
        super().__init__(message)
        self.expected = expected


_NUM = r"([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)"

_COUNT_SUFFIX = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15,
                 # binary: '4Mi tokens' is 4 x 2^20 (what a '4M-token batch' of 1024 x 4096 really is)
                 "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40, "PI": 2**50}
_BYTE_SUFFIX = {
    "B": 1,
    "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "PB": 1e15,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50,
}
_RATE_PREFIX = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_DURATION = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "wk": 604800, "week": 604800, "weeks": 604800,
}


def _finite(value: float, text: object, expected: str) -> float:
    if not math.isfinite(value):
        raise UnitError(f"not a finite number: {text!r}", expected)
    return value


def _number(value: object, expected: str) -> float | None:
    """Plain numbers pass through (bool is rejected: YAML `yes` is not a size)."""
    if isinstance(value, bool):
        raise UnitError(f"expected a number, got a boolean {value!r}", expected)
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an int beyond float range (YAML allows any number of digits)
            raise UnitError(f"number too large (about 10^{int(int(value).bit_length() * 0.30103)})", expected) from None
        return _finite(number, value, expected)
    if not isinstance(value, str):
        raise UnitError(f"expected a number or a string, got {type(value).__name__}", expected)
    return None


def parse_count(value: object) -> int:
    """'70B' -> 70_000_000_000; '15T' -> 15e12; '8192' or 8192 -> 8192; '1.5M' -> 1_500_000; '4Mi' -> 4 x 2^20."""
    expected = "a count such as 8192, 1.5M, 70B or 15T (K=1e3, M=1e6, B=1e9, T=1e12; Ki=2^10, Mi=2^20, Gi=2^30)"
    num = _number(value, expected)
    if num is None:
        text = str(value).strip().replace("_", "").replace(",", "")
        m = re.fullmatch(_NUM + r"\s*([KMBGTP]?|[KMGTP]i)", text, flags=re.IGNORECASE)
        if not m:
            raise UnitError(f"not a count: {value!r}", expected)
        num = _finite(float(m.group(1)) * _COUNT_SUFFIX[m.group(2).upper()], value, expected)
    if num != int(num) and abs(num - round(num)) > 1e-6 * max(1.0, abs(num)):
        raise UnitError(f"a count must be a whole number, got {value!r}", expected)
    return int(round(num))


def parse_bytes(value: object) -> int:
    """'80GiB' -> 85899345920; '80GB' -> 80e9; plain numbers are bytes."""
    expected = "a size such as 80GiB, 141GB or 512MiB (GB=1e9 bytes, GiB=2^30 bytes)"
    num = _number(value, expected)
    if num is None:
        text = str(value).strip().replace("_", "")
        m = re.fullmatch(_NUM + r"\s*([KMGTP]?i?B)", text, flags=re.IGNORECASE)
        if not m:
            raise UnitError(f"not a size in bytes: {value!r}", expected)
        suffix = m.group(2).upper()
        num = _finite(float(m.group(1)) * _BYTE_SUFFIX[suffix], value, expected)
    return int(round(num))


def parse_bandwidth(value: object) -> float:
    """Bytes per second. '400Gb/s' (bits) -> 50e9; '900GB/s' -> 900e9; '3.35TB/s'."""
    expected = "a bandwidth such as 400Gb/s (bits) or 900GB/s (bytes), per direction"
    num = _number(value, expected)
    if num is not None:
        return num
    text = str(value).strip().replace("_", "")
    m = re.fullmatch(_NUM + r"\s*([KMGTP]?)(b|B|bit|byte)(?:/s|ps)", text)
    if not m:
        m2 = re.fullmatch(_NUM + r"\s*([KMGTP]?)(bps|Bps)", text)
        if not m2:
            raise UnitError(f"not a bandwidth: {value!r}", expected)
        m = m2
    unit = m.group(3)
    per_byte = 1.0 if unit in ("B", "byte", "Bps") else 1.0 / 8.0
    return _finite(float(m.group(1)) * _RATE_PREFIX[m.group(2).upper()] * per_byte, value, expected)


def parse_flops(value: object) -> float:
    """FLOP/s. '989TFLOPS' -> 9.89e14; '1.2PFLOPS'; plain numbers are FLOP/s."""
    expected = "a rate such as 989TFLOPS or 1.2PFLOPS"
    num = _number(value, expected)
    if num is not None:
        return num
    text = str(value).strip().replace("_", "")
    m = re.fullmatch(_NUM + r"\s*([KMGTP]?)FLOP(?:S|/s)", text, flags=re.IGNORECASE)
    if not m:
        raise UnitError(f"not a FLOP rate: {value!r}", expected)
    return _finite(float(m.group(1)) * _RATE_PREFIX[m.group(2).upper()], value, expected)


def parse_money(value: object) -> float:
    """Dollars. '$2.5M' -> 2.5e6; '$3.10' -> 3.1; '500K' -> 5e5."""
    expected = "an amount in dollars such as $2.5M, $800K or 2.49"
    num = _number(value, expected)
    if num is not None:
        return num
    text = str(value).strip().replace(",", "").replace("_", "")
    m = re.fullmatch(r"\$?\s*" + _NUM + r"\s*([KMB]?)(?:\s*USD)?", text, flags=re.IGNORECASE)
    if not m:
        raise UnitError(f"not an amount of money: {value!r}", expected)
    return _finite(float(m.group(1)) * _COUNT_SUFFIX[m.group(2).upper()], value, expected)


def parse_duration(value: object) -> float:
    """Seconds. '30d' -> 2592000; '12h'; '90min'; '2w'; plain numbers are seconds."""
    expected = "a duration such as 30d, 12h, 90min or 2w"
    num = _number(value, expected)
    if num is not None:
        return num
    text = str(value).strip()
    m = re.fullmatch(_NUM + r"\s*([A-Za-z]+)", text)
    if not m or m.group(2).lower() not in _DURATION:
        raise UnitError(f"not a duration: {value!r}", expected)
    return _finite(float(m.group(1)) * _DURATION[m.group(2).lower()], value, expected)


_SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def parse_slurm_time(value: object) -> float:
    """Seconds, from a duration ('4d', '48h') or any of SLURM's --time forms: 'MM:SS', 'HH:MM:SS', 'D-HH',
    'D-HH:MM' and 'D-HH:MM:SS' ('48:00:00', '2-00:00:00'). A bare number is refused: SLURM reads it as
    minutes, a dtc duration as seconds, so it is ambiguous."""
    expected = ("a time limit such as 4d, 48h, 48:00:00 or 2-00:00:00 (SLURM's D-HH:MM:SS, HH:MM:SS, MM:SS, D-HH "
                "and D-HH:MM also work)")
    if isinstance(value, (int, float)) and not isinstance(value, bool) or \
            (isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value)):
        raise UnitError(f"a bare number is ambiguous as a time limit (SLURM reads minutes, dtc seconds): {value!r}",
                        f"a unit, since SLURM reads a bare number as minutes and dtc as seconds: e.g. "
                        f"'{value}min' or '{value}s'; or {expected}")
    if isinstance(value, str):
        text = value.strip()
        m = _SLURM_TIME.fullmatch(text)
        if m and (":" in text or "-" in text):
            days, a, b, c = m.groups()
            if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
                parts = [int(a), int(b or 0), int(c or 0)]
            elif c is not None:  # HH:MM:SS
                parts = [int(a), int(b), int(c)]
            else:  # MM:SS (any number of minutes)
                parts = [int(a) // 60, int(a) % 60, int(b)]
            hours, minutes, seconds = parts
            if minutes >= 60 or seconds >= 60 or (days is not None and hours >= 24):
                raise UnitError(f"not a SLURM time: {value!r} (minutes and seconds below 60, hours below 24 after "
                                "a day count)", expected)
            return float(int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds)
    try:
        return parse_duration(value)
    except UnitError:
        raise UnitError(f"not a time limit: {value!r}", expected) from None


def round_sig(x: float, digits: int = 4) -> float:
    """Round to ``digits`` significant digits (keeps goldens stable)."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def format_bytes(n: float) -> str:
    """Binary units for memory: 85899345920 -> '80.0 GiB'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def format_count(n: float) -> str:
    """70553706496 -> '70.55B'."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n:.4g}"


def format_seconds(s: float) -> str:
    """Readable duration: 0.0123 -> '12.3 ms', 5400 -> '1.5 h', 864000 -> '10.0 d'."""
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def format_seconds_range(lo: float, hi: float) -> str:
    """A range in the unit ``format_seconds`` picks for its upper end: (5.9, 7.1) -> '5.90-7.10 s'."""
    if hi < 1:
        return f"{lo * 1e3:.1f}-{hi * 1e3:.1f} ms"
    for limit, size, unit, digits in ((120, 1, "s", 2), (7200, 60, "min", 1), (172800, 3600, "h", 1)):
        if hi < limit:
            return f"{lo / size:.{digits}f}-{hi / size:.{digits}f} {unit}"
    return f"{lo / 86400:.1f}-{hi / 86400:.1f} d"


def format_money_range(lo: float, hi: float) -> str:
    """'$7.10K-$9.30K'."""
    return f"{format_money(lo)}-{format_money(hi)}"


def format_money(x: float) -> str:
    """$ with a suffix: 2500000 -> '$2.50M'."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= size:
            return f"${x / size:.2f}{unit}"
    return f"${x:.2f}"
