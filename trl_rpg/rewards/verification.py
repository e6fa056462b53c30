"""Whether two answers are the same answer: :func:`is_equivalent` (normalised strings, exact rationals, then
``math-verify`` with a timeout), and the checks that overrule every route (units, case).

``math-verify`` is optional and imported lazily on first use, with a timeout (:data:`MATH_VERIFY_TIMEOUT_S`) in the
main thread.  No torch.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from typing import Any

from .extraction import _drop_format_characters
from .normalization import _as_fraction, normalize_answer

__all__ = ["MATH_VERIFY_TIMEOUT_S", "MAX_SYMBOLIC_ANSWER_CHARS", "is_equivalent"]

logger = logging.getLogger(__name__)

#: Timeout (seconds) given to each ``math_verify.parse`` / ``math_verify.verify`` call when we are in the main thread.
#: ``math-verify`` implements timeouts with ``signal.alarm``, which only works in the main thread of the main
#: interpreter; elsewhere timeouts are disabled and :func:`_is_risky` is the only protection against pathological
#: inputs.
MATH_VERIFY_TIMEOUT_S = 5

#: Answers longer than this are only compared as normalised strings (never handed to sympy).
MAX_SYMBOLIC_ANSWER_CHARS = 200

# A number and its unit: "5\text{ cm}", "5 \mbox{kg}", "12 m" (the unit's text in group 1 or 2).
_NUMBER_AND_UNIT_RE = re.compile(
    r"^[+-]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)\s*(?:\\(?:text|mbox|mathrm)\s*\{\s*([A-Za-z][A-Za-z .]*)\}|([A-Za-z]+))$"
)
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
# A decimal number: 3.14, .5 (not 1,000.5, 1.2.3, or 2.5\% whose percent math-verify reads only on a literal)
_DECIMAL_RE = re.compile(r"(?<![\d.,])(\d*)\.(\d+)(?![\d.]|\s*\\?%)")


# ---------------------------------------------------------------------------------------------------------------------
# math-verify backend
# ---------------------------------------------------------------------------------------------------------------------

_MV_UNSET = object()
_mv_module: Any = _MV_UNSET
_mv_lock = threading.Lock()


def _load_math_verify():
    """Import ``math_verify`` once; return the module or ``None`` if it is not installed / broken."""
    global _mv_module
    if _mv_module is _MV_UNSET:
        with _mv_lock:
            if _mv_module is _MV_UNSET:
                try:
                    import math_verify

                    _mv_module = math_verify
                except Exception:  # noqa: BLE001  ImportError, or a broken install (antlr / sympy mismatch)
                    logger.info("math-verify is not available; falling back to normalised string comparison.")
                    _mv_module = None
    return _mv_module


def _timeout_seconds() -> int | None:
    """``math-verify`` timeouts use ``signal.alarm``: only enable them in the main thread of the main interpreter."""
    if threading.current_thread() is threading.main_thread():
        return MATH_VERIFY_TIMEOUT_S
    return None


# Nested powers (10^{10^{10}}, 2^3^4, 2**3**4), huge exponents or huge factorials can make sympy run for minutes or
# exhaust memory; without signal timeouts (off the main thread) we must not hand those to sympy at all.
_RISKY_RES = (
    re.compile(r"\^\s*\{[^{}]*\^"),  # 10^{10^{10}}
    re.compile(r"\^[^{}]*\^"),  # 2^3^4
    re.compile(r"\*\*[^*]*\*\*"),  # 2**3**4
    re.compile(r"(?:\^|\*\*)\s*\{?\s*[+-]?\d{5,}"),  # 2^{123456}
    re.compile(r"\d{4,}\s*!"),  # 10000!
)


def _is_risky(s: str) -> bool:
    if len(s) > MAX_SYMBOLIC_ANSWER_CHARS:
        return True
    return any(r.search(s) for r in _RISKY_RES)


@functools.lru_cache(maxsize=8192)
def _mv_parse(s: str, timeout: int | None) -> tuple:
    """Parse an (already extracted) answer with math-verify; empty tuple if unparseable."""
    mv = _load_math_verify()
    cfg = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    for candidate in (f"${s}$", s):
        try:
            parsed = mv.parse(candidate, extraction_config=cfg, parsing_timeout=timeout)
        except BaseException as e:  # math_verify.errors.TimeoutException derives from BaseException
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            parsed = []
        if parsed:
            return tuple(parsed)
    return ()


def _math_verify_equal(pred: str, gold: str) -> bool:
    mv = _load_math_verify()
    if mv is None or _is_risky(pred) or _is_risky(gold):
        return False
    timeout = _timeout_seconds()
    gold_parsed = _mv_parse(gold, timeout)
    pred_parsed = _mv_parse(pred, timeout)
    if not gold_parsed or not pred_parsed:
        return False
    try:
        return bool(mv.verify(list(gold_parsed), list(pred_parsed), timeout_seconds=timeout))
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return False


def is_equivalent(pred: str | None, gold: str | None, *, use_math_verify: bool = True) -> bool:
    """Whether the predicted answer ``pred`` is equivalent to the reference answer ``gold``.

    ``pred`` and ``gold`` are bare answers (use :func:`extract_answer` on a full response first).  The answers are
    equivalent if any of these holds:

    1. their :func:`normalize_answer` forms are equal and non-empty;
    2. both normalise to exact rationals (integer, decimal, ``a/b``, ``\\frac{a}{b}``) with the same value (this
       route works without ``math-verify``; two different integers are never equivalent);
    3. ``math-verify`` (if installed and ``use_math_verify``) parses both and ``verify(gold, pred)`` is True (this
       also accepts e.g. ``\\sqrt{2}`` == ``2^{1/2}`` and ``50\\%`` == ``0.5``); each decimal is given to it as the
       exact fraction it writes, so a decimal never equals a number it only approximates (``3.141593`` is not
       ``\\pi``, ``0.333333`` is not ``\\frac{1}{3}``).

    Whatever the route, two answers are not equivalent when both are a number with a unit and the units differ
    (``5\\text{ cm}`` vs ``5\\text{ m}``; a unit on one side only is ignored), or when their letters differ only in
    case (``b`` vs ``B``: case matters).  Invisible Unicode format characters (right-to-left marks, zero-width spaces)
    are ignored.

    ``math-verify`` is called with signal-based timeouts (:data:`MATH_VERIFY_TIMEOUT_S`) in the main thread and without
    timeouts elsewhere (threads, where ``signal.alarm`` is unavailable); pathological inputs (nested/huge powers, very
    long strings) are never given to sympy.  Any error or timeout inside ``math-verify`` counts as "not equivalent" by
    that route.
    """
    if pred is None or gold is None:
        return False
    pred, gold = str(pred).strip(), str(gold).strip()
    if not pred or not gold:
        return False
    upred, ugold = _unit(pred), _unit(gold)
    if upred is not None and ugold is not None and upred != ugold:
        return False  # 5 cm is not 5 m (a unit on one side only is ignored: "5 cm" is "5")
    npred, ngold = normalize_answer(pred), normalize_answer(gold)
    if npred and npred == ngold:
        return True
    if _differ_in_case_only(npred, ngold):
        return False  # math-verify would accept "b" for "B"
    fp, fg = _as_fraction(npred), _as_fraction(ngold)
    if fp is not None and fg is not None:
        if fp == fg:
            return True
        if fp.denominator == 1 and fg.denominator == 1:
            return False  # two different integers: nothing math-verify could add (and it is the common case)
    if use_math_verify:
        # Decimals are handed over as the exact rationals they write, so that 3.141593 is not \pi and 0.333333 is not
        # 1/3 (math-verify compares a decimal with a tolerance).
        return _math_verify_equal(_exact_decimals(pred), _exact_decimals(gold))
    return False


def _unit(answer: str) -> str | None:
    """The unit of an answer that is a number and a unit (``5\\text{ cm}``, ``12 m``: ``"cm"``, ``"m"``), without
    spaces; ``None`` for any other answer."""
    s = re.sub(r"\\[!,;: ]|~", " ", _drop_format_characters(answer)).replace("$", "").strip().rstrip(".").strip()
    m = _NUMBER_AND_UNIT_RE.match(s)
    return None if m is None else re.sub(r"\s+", "", m.group(1) or m.group(2)).rstrip(".")


def _differ_in_case_only(a: str, b: str) -> bool:
    """Whether the letters of two normalised answers (outside LaTeX commands) differ, but not once case is ignored:
    ``B`` vs ``b``, ``2A`` vs ``2a`` (case matters)."""
    letters_a = set(re.findall(r"[A-Za-z]", _COMMAND_RE.sub("", a)))
    letters_b = set(re.findall(r"[A-Za-z]", _COMMAND_RE.sub("", b)))
    return letters_a != letters_b and {c.lower() for c in letters_a} == {c.lower() for c in letters_b}


def _exact_decimals(answer: str) -> str:
    """``answer`` with each decimal number written as the exact fraction it is: ``"3.14"`` -> ``"\\frac{314}{100}"``
    (``"x=2"``, ``"1,000.5"``, ``"2.5\\%"`` are left as they are)."""
    return _DECIMAL_RE.sub(lambda m: f"\\frac{{{int(m.group(1) + m.group(2))}}}{{{10 ** len(m.group(2))}}}", answer)
