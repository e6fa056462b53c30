"""`trl_rpg.rewards.grading`: answers that look alike but are not the same answer, and invisible characters.

Each test names the piece of `trl_rpg/rewards/grading.py` it guards; without that piece the case is scored wrongly
(issue 20, section 3; issue 22, section 1).
"""

import importlib.util

import pytest

from trl_rpg.rewards import extract_answer, is_equivalent, math_reward, normalize_answer

needs_math_verify = pytest.mark.skipif(
    importlib.util.find_spec("math_verify") is None, reason="math-verify is not installed"
)


def test_a_negative_fraction_is_not_its_absolute_value():
    # `_as_fraction` must keep the sign of `-\frac{a}{b}` (`return value` would make them equal)
    assert not is_equivalent("-\\frac{1}{2}", "\\frac{1}{2}")
    assert math_reward(["Answer: $-\\frac{1}{2}$"], ground_truth=["\\frac{1}{2}"]) == [0.0]
    assert math_reward(["Answer: $-\\frac{1}{2}$"], ground_truth=["-0.5"]) == [1.0]


def test_digits_separated_by_a_space_are_not_one_number():
    # `_drop_spaces`: all whitespace was removed, so "1 2" was "12"
    assert normalize_answer("1 2") == "1 2"
    assert not is_equivalent("1 2", "12")
    assert math_reward(["Answer: 1 2"], ground_truth=["12"]) == [0.0]
    assert is_equivalent("1  2", "1 2")
    # thousands separated by spaces stay one number, and other spaces still go
    assert is_equivalent("10\\,000", "10000") and is_equivalent("1 000 000", "1000000")
    assert is_equivalent("x = 5", "5") and is_equivalent("(1, 2)", "(1,2)") and normalize_answer("2 x") == "2x"


def test_different_units_are_different_answers():
    # `_unit`: the unit suffix is dropped by normalisation, so 5 cm was 5 m
    assert not is_equivalent("5\\text{ cm}", "5\\text{ m}")
    assert not is_equivalent("5 cm", "5\\text{ m}")
    assert math_reward(["Answer: $5\\text{ cm}$"], ground_truth=["5\\text{ m}"]) == [0.0]
    # the same unit, or a unit on one side only, still matches
    assert is_equivalent("5\\text{ cm}", "5\\text{cm}")
    assert is_equivalent("5\\text{ cm}", "5") and is_equivalent("5", "5\\mbox{ cm}")


@needs_math_verify
def test_a_decimal_is_the_exact_number_it_writes():
    # `_exact_decimals`: math-verify compares a decimal with a tolerance, so 3.141593 was pi
    assert not is_equivalent("3.141593", "\\pi")
    assert not is_equivalent("\\pi", "3.141593")
    assert not is_equivalent("1.414214", "\\sqrt{2}")
    assert math_reward(["Answer: 3.141593"], ground_truth=["\\pi"]) == [0.0]
    # two exact numbers are decided by their values alone
    assert not is_equivalent("0.333333", "\\frac{1}{3}")
    # an exact value still matches a symbolic reference
    assert is_equivalent("1.5", "\\frac{\\sqrt{9}}{2}") and is_equivalent("2", "\\sqrt{4}")
    assert is_equivalent("0.5", "\\frac{1}{2}")
    assert is_equivalent("50\\%", "0.5") and is_equivalent("2.5\\%", "0.025")  # math-verify's reading of percents


@needs_math_verify
def test_case_matters():
    # `_differ_in_case_only`: math-verify treats b and B as the same symbol
    assert not is_equivalent("b", "B")
    assert not is_equivalent("2a+1", "2A+1")
    assert math_reward(["Answer: b"], ground_truth=["B"]) == [0.0]
    assert is_equivalent("\\text{(B)}", "(B)") and is_equivalent("a+b", "b+a")


@pytest.mark.parametrize("mark", ["\u200f", "\u200e", "\u061c", "\u200b", "\ufeff"])
def test_invisible_direction_marks_around_a_number_are_ignored(mark):
    # `_drop_format_characters`: right-to-left text puts marks around its numbers, which scored 0
    assert is_equivalent(f"{mark}42{mark}", "42")
    assert math_reward([f"Answer: {mark}42{mark}", f"{mark}Answer: 42\n"], ground_truth=["42", "42"]) == [1.0, 1.0]


def test_an_answer_line_opened_by_a_direction_mark_is_an_answer_line():
    # `extract_answer` drops the marks first: otherwise the line is no answer line and the earlier box wins
    assert extract_answer("First guess \\boxed{7}.\n\u200fAnswer: 42") == "42"


def test_bidirectional_embeddings_and_isolates_are_ignored():
    assert math_reward(["Answer: \u202b42\u202c", "Answer: \u2067-3\u2069"], ground_truth=["42", "-3"]) == [1.0, 1.0]
    assert normalize_answer("\u2066\\frac{1}{2}\u2069") == "\\frac{1}{2}"
