"""Grading an answer: extract the final answer of a completion, normalise it, and compare it with a reference.

The prompts used in the RPG paper (DAPO-Math format) ask the model to finish its response with a line of the form
``Answer: $Answer``.  This module is the one scoring rule shared by the training reward
(:func:`trl_rpg.rewards.math_reward`) and the benchmark evaluation (:mod:`trl_rpg.evaluation`):

* :func:`extract_answer` -- the last answer a completion commits to (an ``Answer:`` line or a ``\\boxed{}``).
* :func:`normalize_answer` -- canonical string used for exact comparison.
* :func:`is_equivalent` -- ``math-verify`` equivalence (if installed) OR normalised-string / exact-number equality.
* :func:`completion_to_text` -- the text of a completion (a string or a conversational message list).
* :func:`reference_answer` -- a row's reference answer (:data:`ANSWER_COLUMNS`: ``ground_truth``,
  ``reward_model.ground_truth``, ``answer``).
* :func:`score_completion` / :func:`score_answer` -- the score of a completion / of an extracted answer.

The module does not import torch.  ``math-verify`` is optional and imported lazily on first use, with a timeout
(:data:`MATH_VERIFY_TIMEOUT_S`) in the main thread.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import unicodedata
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

__all__ = [
    "ANSWER_COLUMNS",
    "MATH_VERIFY_TIMEOUT_S",
    "MAX_SYMBOLIC_ANSWER_CHARS",
    "completion_to_text",
    "extract_answer",
    "is_equivalent",
    "normalize_answer",
    "reference_answer",
    "score_answer",
    "score_completion",
]

logger = logging.getLogger(__name__)

#: Timeout (seconds) given to each ``math_verify.parse`` / ``math_verify.verify`` call when we are in the main thread.
#: ``math-verify`` implements timeouts with ``signal.alarm``, which only works in the main thread of the main
#: interpreter; elsewhere timeouts are disabled and :func:`_is_risky` is the only protection against pathological
#: inputs.
MATH_VERIFY_TIMEOUT_S = 5

#: Answers longer than this are only compared as normalised strings (never handed to sympy).
MAX_SYMBOLIC_ANSWER_CHARS = 200


# ---------------------------------------------------------------------------------------------------------------------
# Answer extraction
# ---------------------------------------------------------------------------------------------------------------------

# "Answer:", "Final Answer:", "**Answer:**", "**Answer**:", "ANSWER :" ...
_ANSWER_RE = re.compile(r"\banswer\s*(?:\*\*|__)?\s*:", re.IGNORECASE)
# An answer line: the marker opens the line, after optional markdown (`**`, `#`, `>`, a list bullet or number) and an
# optional "Final" / "The final" ("**Final Answer:** 7", "## Answer: 7", "- Answer: 7").
_ANSWER_LINE_RE = re.compile(
    r"^[ \t]*(?:(?:[#>*_+-]+|\d+[.)])[ \t]*)*(?:(?:the[ \t]+)?final[ \t]+)?answer\s*(?:\*\*|__)?\s*:", re.IGNORECASE
)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_NOBRACE_RE = re.compile(r"\\boxed[ \t]+([^\s${}]+)")


def _braced_content(text: str, open_idx: int) -> tuple[str, int] | None:
    """Content of the brace group whose ``{`` is at ``text[open_idx]``, and the index just past the matching ``}``.

    Returns ``None`` when the group is not closed (e.g. a truncated completion).  Escaped braces ``\\{``/``\\}`` are
    treated as ordinary characters.
    """
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":  # skip the escaped character (\{, \}, \\)
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_idx + 1 : i], i + 1
        i += 1
    return None


def _boxed_answers(text: str) -> list[tuple[int, str]]:
    """``(position, content)`` of every complete ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x`` in ``text``."""
    found: list[tuple[int, str]] = []
    for match in _BOXED_RE.finditer(text):
        group = _braced_content(text, match.end() - 1)
        if group is not None:
            found.append((match.start(), group[0]))
    for match in _BOXED_NOBRACE_RE.finditer(text):
        found.append((match.start(), match.group(1)))
    return sorted(found)


def _last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed x``) in ``text``."""
    found = _boxed_answers(text)
    return found[-1][1] if found else None


def _strip_math_delimiters(s: str) -> str:
    """Strip whitespace, markdown emphasis, ``$``/``\\(``/``\\[`` delimiters and trailing periods, until stable."""
    prev = None
    while s != prev:
        prev = s
        s = s.strip()
        s = s.strip("*_`")  # markdown: **540**, `540`
        s = s.strip()
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
                s = s[len(left) : len(s) - len(right)]
        s = s.strip()
        if s.endswith(".") and not s.endswith(".."):
            s = s[:-1]
    return s


def _clean_answer(raw: str) -> str | None:
    """The bare answer in the text after an ``Answer:`` marker, or None if there is none (empty, or only a truncated
    ``\\boxed{``)."""
    s = _strip_math_delimiters(raw)
    boxed = _last_boxed(s)
    if boxed is not None:
        s = _strip_math_delimiters(boxed)
    elif _BOXED_RE.search(s):  # "Answer: \boxed{12" (truncated): no answer yet
        return None
    # remaining inline math delimiters, e.g. "$x=5$ or $x=6$" -> "x=5 or x=6"
    s = s.replace("$", "")
    s = _strip_math_delimiters(s)
    return s or None


def _marker_answers(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """The ``Answer:`` candidates of ``text``: those on answer lines (the marker opens the line) and those inside a
    sentence ("so the answer: 42"), as ``(position, answer)``.  On a line, the text after its last marker is the
    answer; when nothing follows, the next non-empty line (unless it has a marker of its own).  Markers followed by no
    answer are skipped."""
    on_lines: list[tuple[int, str]] = []
    in_sentences: list[tuple[int, str]] = []
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for index, line in enumerate(lines):
        markers = list(_ANSWER_RE.finditer(line))
        if not markers:
            continue
        rest = line[markers[-1].end() :]
        answer = _clean_answer(rest)
        if answer is None and not _strip_math_delimiters(rest):  # "Answer:\n$540$", "**Answer:**\n540"
            following = next((i for i in range(index + 1, len(lines)) if lines[i].strip()), None)
            if following is not None and not _ANSWER_RE.search(lines[following]):
                answer = _clean_answer(lines[following])
        if answer is not None:
            is_line = _ANSWER_LINE_RE.match(line) is not None
            (on_lines if is_line else in_sentences).append((offsets[index] + markers[-1].start(), answer))
    return on_lines, in_sentences


def extract_answer(text: str | None) -> str | None:
    """Extract the final answer of a model response: the last answer the response commits to.

    The rule:

    1. The response *commits* to an answer with an answer line, a line opened by an ``Answer:`` marker
       (case-insensitive, after optional markdown ``**``/``#``/``>``/bullets and an optional ``Final``:
       ``Answer: 540``, ``**Final Answer:** 540``), or with a complete (brace-balanced) ``\\boxed{...}`` /
       ``\\fbox{...}``.  Of all these, the one that appears **last** in the response wins, so an answer revised later
       replaces an earlier one, whichever form each takes.
       On an answer line the answer is the text after the line's last marker (unwrapping a ``\\boxed{}`` there), or,
       when nothing follows it, the next non-empty line.  A marker followed by no answer (an empty or truncated
       ``Answer:``) commits to nothing and is skipped.
    2. Only if there is no such answer, an ``Answer:`` marker inside a sentence (``"... so the answer: 42"``): the
       last one followed by an answer.  Such a phrase never beats an answer line or a box, wherever it appears
       ("we need the answer: first compute x ... \\boxed{42}" gives ``42``).
    3. Otherwise ``None``.

    The answer is cleaned: surrounding whitespace, markdown ``**``, ``$...$``/``\\(...\\)``/``\\[...\\]``
    delimiters, any remaining ``$`` and a trailing period are removed, and a ``\\boxed{...}`` wrapper is unwrapped.

    Examples::

        >>> extract_answer("... so the sum is 540.\\nAnswer: 540")
        '540'
        >>> extract_answer("Answer: $\\\\frac{1}{2}$.")
        '\\\\frac{1}{2}'
        >>> extract_answer("We need the answer: first compute x. x = 6, so \\\\boxed{42}")
        '42'
        >>> extract_answer("no answer here") is None
        True
    """
    if not text:
        return None
    text = _drop_format_characters(text)
    on_lines, in_sentences = _marker_answers(text)
    boxes = [(start, answer) for start, content in _boxed_answers(text) if (answer := _clean_answer(content))]
    candidates = on_lines + boxes or in_sentences
    if not candidates:
        return None
    return max(candidates, key=lambda candidate: candidate[0])[1]


# ---------------------------------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------------------------------

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
# A number and its unit: "5\text{ cm}", "5 \mbox{kg}", "12 m" (the unit's text in group 1 or 2).
_NUMBER_AND_UNIT_RE = re.compile(
    r"^[+-]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)\s*(?:\\(?:text|mbox|mathrm)\s*\{\s*([A-Za-z][A-Za-z .]*)\}|([A-Za-z]+))$"
)
_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
# A decimal number: 3.14, .5 (not 1,000.5, 1.2.3, or 2.5\% whose percent math-verify reads only on a literal)
_DECIMAL_RE = re.compile(r"(?<![\d.,])(\d*)\.(\d+)(?![\d.]|\s*\\?%)")


def _drop_format_characters(s: str) -> str:
    """``s`` without Unicode format characters (category Cf): right-to-left and left-to-right marks, bidirectional
    embeddings and isolates, zero-width spaces and joiners, the byte-order mark.  They are invisible, carry no
    mathematics, and a right-to-left completion puts them around its numbers."""
    return "".join(c for c in s if unicodedata.category(c) != "Cf") if not s.isascii() else s


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


# ---------------------------------------------------------------------------------------------------------------------
# Completions, reference answers and scoring (shared by math_reward and trl_rpg.evaluation)
# ---------------------------------------------------------------------------------------------------------------------


def completion_to_text(completion: Any) -> str:
    """Text of a completion given as a string or as a conversational list of messages.

    For a message list the content of the last ``assistant`` message (else the last message) is used; multimodal
    content (a list of ``{"type": "text", "text": ...}`` parts) is concatenated.
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        content = completion.get("content", "")
    else:
        messages = list(completion)
        if not messages:
            return ""
        assistant = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant"]
        message = assistant[-1] if assistant else messages[-1]
        content = message.get("content", "") if isinstance(message, Mapping) else message
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, Mapping):
            if part.get("type", "text") == "text":
                parts.append(str(part.get("text", "")))
        else:
            parts.append(str(part))
    return "".join(parts)



#: The dataset columns that hold a row's reference answer, in the order they are read: a ``ground_truth`` string (or
#: list of acceptable answers), a verl/DAPO ``reward_model`` dict with a ``"ground_truth"`` key, a plain ``answer``.
ANSWER_COLUMNS = ("ground_truth", "reward_model", "answer")


def _reference_values(value: Any) -> list[str]:
    """The non-empty reference strings in one column value (a string, a number, or a list of them)."""
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple)) else [value]
    return [str(v).strip() for v in values if v is not None and str(v).strip()]


def reference_answer(row: Mapping[str, Any]) -> str | list[str] | None:
    """The reference answer of one dataset row, read from the first of :data:`ANSWER_COLUMNS` that holds one.

    ``row["ground_truth"]``, else ``row["reward_model"]["ground_truth"]``, else ``row["answer"]``; empty strings and
    ``None`` count as missing.  Returns the stripped string, a list of strings when the column holds several
    acceptable answers, or ``None`` when the row has no reference.
    """
    reward_model = row.get("reward_model")
    for value in (row.get("ground_truth"),
                  reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None,
                  row.get("answer")):
        values = _reference_values(value)
        if values:
            return values if isinstance(value, (list, tuple)) else values[0]
    return None


def score_answer(answer: str | None, reference: Any) -> float | None:
    """Score an extracted answer against a reference: ``1.0`` if :func:`is_equivalent` to it (or, for a list of
    references, to any of them), ``0.0`` if not or if there is no answer, ``None`` if there is no reference."""
    references = _reference_values(reference)
    if not references:
        return None
    if answer is None:
        return 0.0
    return 1.0 if any(is_equivalent(answer, r) for r in references) else 0.0


def score_completion(completion: Any, reference: Any) -> float | None:
    """Score a completion (a string or a conversational message list): :func:`extract_answer` of its text, then
    :func:`score_answer`.  This is the rule of both the training reward :func:`math_reward` and the benchmark
    evaluation (:mod:`trl_rpg.evaluation`)."""
    return score_answer(extract_answer(completion_to_text(completion)), reference)
