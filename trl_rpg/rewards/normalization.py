"""Normalising an answer for exact comparison: :func:`normalize_answer`, and the exact rational value of a
normalised number (``_as_fraction``).  No torch.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from .extraction import _BOXED_RE, _braced_content, _drop_format_characters

__all__ = ["normalize_answer"]

_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)\s*\{")
_UNIT_SUFFIX_RE = re.compile(
    r"(?<=[0-9}])\s*\\(?:text|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z .]*\}\s*$"
)  # "5\text{ cm}" -> "5"
_NUMBER_RE = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)$")
_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_SIMPLE_ASSIGN_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?=(?!=)")
_FRAC_SHORT_RE = re.compile(r"\\frac(\d)(\d)")
_FRAC_SHORT2_RE = re.compile(r"\\frac\{([^{}]*)\}(\d)")
_SQRT_SHORT_RE = re.compile(r"\\sqrt(\d+)")
_SPACED_THOUSANDS_RE = re.compile(r"^[+-]?\d{1,3}(?:\s\d{3})+(?:\.\d+)?$")  # "10 000", "10\,000"


def _drop_spaces(s: str) -> str:
    """``s`` without whitespace, except that two digits separated by whitespace keep one space between them
    (``"1 2"`` is not ``"12"``) unless the whole answer is a number with thousands separated by spaces
    (``"10 000"``)."""
    s = s.strip()
    if _SPACED_THOUSANDS_RE.match(s):
        return re.sub(r"\s+", "", s)
    s = re.sub(r"(?<=\d)\s+(?=\d)", " ", s)
    return re.sub(r"(?<!\d)\s+|\s+(?!\d)", "", s)


def _unwrap_command(s: str, pattern: re.Pattern[str]) -> str:
    """Replace ``\\cmd{content}`` by ``content`` (brace-balanced) for every match of ``pattern``."""
    while True:
        m = pattern.search(s)
        if m is None:
            return s
        res = _braced_content(s, m.end() - 1)
        if res is None:  # unbalanced: drop just the command name
            return s[: m.start()] + s[m.end() - 1 :]
        content, end = res
        s = s[: m.start()] + content + s[end:]


def _canonical_number(s: str) -> str:
    """Canonical form of a plain decimal number: ``"045"``->``"45"``, ``"5.50"``->``"5.5"``, ``"-0"``->``"0"``."""
    try:
        d = Decimal(s)
    except InvalidOperation:  # pragma: no cover - guarded by _NUMBER_RE
        return s
    if d == 0:
        return "0"
    out = format(d.normalize(), "f")
    return out


def normalize_answer(s: Any) -> str:
    """Normalise an answer string for exact comparison.

    The transformations (applied in this order) are:

    * ``None`` -> ``""``; non-strings are converted with ``str``; Unicode format characters (right-to-left marks,
      zero-width spaces) are dropped; a whole-string ``\\boxed{}``/``\\fbox{}`` is unwrapped.
    * remove ``$``, ``\\(``, ``\\)``, ``\\[``, ``\\]``, ``\\displaystyle``, ``\\left``, ``\\right``, LaTeX spacing
      (``\\!``, ``\\,``, ``\\;``, ``\\:``, ``\\ ``, ``~``, ``\\quad``);
    * degree marks (``^\\circ``, ``^{\\circ}``, ``°``, ``\\degree``) and percent signs (``\\%``, ``%``) are dropped;
    * a trailing unit in text form after a number is dropped (``5\\text{ cm}`` -> ``5``);
    * text/font wrappers are unwrapped (``\\text{}``, ``\\textbf{}``, ``\\mathrm{}``, ``\\mathbf{}``, ``\\mbox{}``,
      ...);
    * ``\\dfrac``/``\\tfrac`` -> ``\\frac``; ``\\frac12`` -> ``\\frac{1}{2}``; ``\\sqrt2`` -> ``\\sqrt{2}``;
    * all whitespace is removed, then trailing periods, except that whitespace between two digits stays one space
      (``1 2`` is not ``12``) unless the answer is a number whose thousands are separated by spaces (``10\\,000``);
    * a single-variable assignment prefix is dropped (``x=5`` -> ``5``, ``a_1=3`` -> ``3``);
    * ``{,}`` and thousands separators are removed (``1,000`` -> ``1000``, ``1{,}000`` -> ``1000``), but a
      comma-separated list such as ``1,2`` is kept;
    * plain decimal numbers are canonicalised: leading ``+`` and leading zeros removed, trailing fractional zeros
      removed (``045`` -> ``45``, ``5.0`` -> ``5``, ``-0`` -> ``0``, ``.5`` -> ``0.5``).

    Case is preserved (``A`` and ``a`` differ).
    """
    if s is None:
        return ""
    s = _drop_format_characters(str(s)).strip()
    if not s:
        return ""
    # whole-string \boxed{...}
    m = _BOXED_RE.match(s)
    if m is not None:
        res = _braced_content(s, m.end() - 1)
        if res is not None and not s[res[1] :].strip():
            s = res[0]
    s = s.replace("\\displaystyle", "")
    for tok in ("$", "\\(", "\\)", "\\[", "\\]"):
        s = s.replace(tok, "")
    s = re.sub(r"\\left(?![a-zA-Z])|\\right(?![a-zA-Z])", "", s)
    s = re.sub(r"\\(?:quad|qquad)(?![a-zA-Z])", " ", s)
    s = re.sub(r"\\[!,;: ]", " ", s)
    s = s.replace("~", " ")
    # degrees and percent
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree(?![a-zA-Z])", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = _UNIT_SUFFIX_RE.sub("", s)
    s = _unwrap_command(s, _TEXT_WRAPPER_RE)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _drop_spaces(s)
    s = _FRAC_SHORT_RE.sub(r"\\frac{\1}{\2}", s)
    s = _FRAC_SHORT2_RE.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT_RE.sub(r"\\sqrt{\1}", s)
    s = s.rstrip(".")
    if s.count("=") == 1:
        s = _SIMPLE_ASSIGN_RE.sub("", s)
    s = s.replace("{,}", "")
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    if _NUMBER_RE.match(s):
        s = _canonical_number(s)
    return s


_FRAC_FULL_RE = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")
_SLASH_RE = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")


def _as_fraction(normalized: str) -> Fraction | None:
    """Exact rational value of a normalised integer / decimal / ``a/b`` / ``\\frac{a}{b}`` string, else None."""
    try:
        if _NUMBER_RE.match(normalized):
            return Fraction(Decimal(normalized))
        m = _SLASH_RE.match(normalized)
        if m:
            return Fraction(int(m.group(1)), int(m.group(2)))
        m = _FRAC_FULL_RE.match(normalized)
        if m:
            value = Fraction(int(m.group(2)), int(m.group(3)))
            return -value if m.group(1) == "-" else value
    except (ValueError, ZeroDivisionError, InvalidOperation):
        return None
    return None
