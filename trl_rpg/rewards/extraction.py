"""Extracting the final answer of a completion: the last ``Answer:`` line or ``\\boxed{}`` it commits to.

* :func:`extract_answer` -- the rule (docstring below); the prompts of the RPG paper (DAPO-Math format) ask the model
  to finish with a line ``Answer: $Answer``.

The brace matching (``_braced_content``), the ``\\boxed`` pattern and the removal of invisible Unicode format
characters (``_drop_format_characters``) are shared with :mod:`trl_rpg.rewards.normalization`.  No torch.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["extract_answer"]

# "Answer:", "Final Answer:", "**Answer:**", "**Answer**:", "ANSWER :" ...
_ANSWER_RE = re.compile(r"\banswer\s*(?:\*\*|__)?\s*:", re.IGNORECASE)
# An answer line: the marker opens the line, after optional markdown (`**`, `#`, `>`, a list bullet or number) and an
# optional "Final" / "The final" ("**Final Answer:** 7", "## Answer: 7", "- Answer: 7").
_ANSWER_LINE_RE = re.compile(
    r"^[ \t]*(?:(?:[#>*_+-]+|\d+[.)])[ \t]*)*(?:(?:the[ \t]+)?final[ \t]+)?answer\s*(?:\*\*|__)?\s*:", re.IGNORECASE
)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_NOBRACE_RE = re.compile(r"\\boxed[ \t]+([^\s${}]+)")


def _drop_format_characters(s: str) -> str:
    """``s`` without Unicode format characters (category Cf): right-to-left and left-to-right marks, bidirectional
    embeddings and isolates, zero-width spaces and joiners, the byte-order mark.  They are invisible, carry no
    mathematics, and a right-to-left completion puts them around its numbers."""
    return "".join(c for c in s if unicodedata.category(c) != "Cf") if not s.isascii() else s


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
