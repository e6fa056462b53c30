import importlib.util
import pickle
import threading
import time

import pytest

from trl_rpg.rewards import (
    ANSWER_COLUMNS,
    REWARD_FUNCS,
    check_reward_columns,
    completion_to_text,
    extract_answer,
    get_reward_func,
    is_equivalent,
    make_math_reward,
    make_overlong_punishment,
    math_reward,
    normalize_answer,
    paper_math_reward,
    reference_answer,
    register_reward,
    reward_columns,
    score_answer,
    score_completion,
    verification,
)

needs_math_verify = pytest.mark.skipif(
    importlib.util.find_spec("math_verify") is None, reason="math-verify is not installed"
)


# ---------------------------------------------------------------------------------------------------------------------
# extract_answer
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: 540", "540"),
        ("Some reasoning.\n\nAnswer: 540", "540"),
        ("Answer: $\\frac{1}{2}$", "\\frac{1}{2}"),
        ("Answer: $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("Answer: 33.", "33"),
        ("Answer:   $$ 7 $$  ", "7"),
        ("Answer: \\(12\\)", "12"),
        ("Answer: \\boxed{204}", "204"),
        ("Answer: $\\boxed{\\dfrac{3}{4}}$", "\\dfrac{3}{4}"),
        ("**Answer:** 45", "45"),
        ("**Answer**: $45$", "45"),
        ("Final Answer: 113", "113"),
        ("answer: 9", "9"),
        ("Answer:\n$540$", "540"),
        ("**Answer:**\n\n$42$", "42"),
        ("Answer: 1\nmore thinking\nAnswer: 2", "2"),
        ("First Answer: 3 then Answer: 4", "4"),
        ("Answer: 1\nAnswer: 2\nAnswer: 3", "3"),
        ("so the result is \\boxed{33}", "33"),
        ("\\boxed{1} and later \\boxed{33}.", "33"),
        ("Thus $\\boxed{\\frac{a}{b}}$", "\\frac{a}{b}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("\\fbox{12}", "12"),
        ("\\boxed 5", "5"),
        ("\\boxed{3} and a truncated \\boxed{4", "3"),
        ("No final answer here.", None),
        ("", None),
        (None, None),
        ("Answer:", None),
        ("Answer: 5\nthinking more...\nAnswer:", "5"),  # an empty Answer: commits to nothing: the last real one wins
        ("\\boxed{5}\nAnswer:", "5"),
        ("\\boxed{", None),
        ("Answer: \\boxed{12", None),  # a truncated box is no answer
        ("## Answer: 7", "7"),
        ("- **Final Answer:** $7$", "7"),
        ("so the answer: 42", "42"),  # a marker inside a sentence counts when nothing else commits
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        # the reported case: an early phrase with "answer:" must not beat the final \boxed{}
        ("We need the answer: first compute x.\nx = 6, so the total is \\boxed{42}.", "42"),
        ("To find the answer: we add 40 and 2.\n$40 + 2 = 42$.\nThus $\\boxed{42}$", "42"),
        # ... nor an answer line that follows it
        ("We need the answer: first compute x.\nx = 6\nAnswer: 42", "42"),
        # ... even with nothing after it but the phrase (it is inside a sentence: answer lines win wherever they are)
        ("Answer: 42\nCheck: we need the answer: 42 is consistent.", "42"),
        ("\\boxed{42}\nso this is the answer: 42 indeed", "42"),
        # whichever form comes last wins: a revised answer replaces an earlier one
        ("Answer: 10\nWait, I made an error. The result is \\boxed{11}", "11"),
        ("First guess \\boxed{10}.\nRechecking...\nAnswer: 11", "11"),
        ("\\boxed{10}\nAnswer: \\boxed{11}", "11"),
        ("Answer: 10\nAnswer: 11", "11"),
        # a box inside the answer line belongs to it
        ("Answer: $\\boxed{11}$ (and not 10)", "11"),
        # a truncated box after an answer does not replace it
        ("Answer: 11\nor maybe \\boxed{1", "11"),
    ],
)
def test_extract_answer_last_committed_answer_wins(text, expected):
    assert extract_answer(text) == expected


def test_reported_case_scores_right_in_training_and_evaluation():
    from trl_rpg.evaluation.evaluate import score_completions

    completion = "We need the answer: first compute x.\nx = 6, so the total is \\boxed{42}."
    assert math_reward([completion], ground_truth=["42"]) == [1.0]
    conversation = [[{"role": "assistant", "content": completion}]]
    assert math_reward(conversation, reward_model=[{"ground_truth": "42"}]) == [1.0]
    assert score_completions([completion], ["42"]) == [1.0]


# ---------------------------------------------------------------------------------------------------------------------
# normalize_answer
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("045", "45"),
        ("  540 ", "540"),
        ("540.", "540"),
        ("$540$", "540"),
        ("1,000", "1000"),
        ("1{,}000", "1000"),
        ("1\\,000", "1000"),
        ("1,2", "1,2"),
        ("+7", "7"),
        ("-0", "0"),
        ("5.0", "5"),
        ("0.50", "0.5"),
        ("100", "100"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("\\text{(A)}", "(A)"),
        ("\\textbf{7}", "7"),
        ("336^\\circ", "336"),
        ("336^{\\circ}", "336"),
        ("50\\%", "50"),
        ("5\\text{ cm}", "5"),
        ("x = 5", "5"),
        ("\\boxed{12}", "12"),
        ("2\\!\\cdot\\!3", "2\\cdot3"),
        (None, ""),
        (12, "12"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


# ---------------------------------------------------------------------------------------------------------------------
# is_equivalent
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("540", "540"),
        ("045", "45"),
        ("0.5", "\\frac{1}{2}"),
        ("1/2", "\\frac{1}{2}"),
        ("\\dfrac{1}{2}", "0.5"),
        pytest.param("\\sqrt{2}", "2^{1/2}", marks=needs_math_verify),
        pytest.param("x^2+1", "1+x^2", marks=needs_math_verify),
        ("336", "336^\\circ"),
        ("1,000", "1000"),
        ("x = 5", "5"),
    ],
)
def test_is_equivalent_true(pred, gold):
    assert is_equivalent(pred, gold) is True


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("540", "541"),
        ("0.5", "\\frac{1}{3}"),
        ("\\sqrt{2}", "2"),
        ("-1", "1"),
        ("", "5"),
        (None, "5"),
        ("5", None),
        ("5", ""),
        ("x+1", "x+2"),
    ],
)
def test_is_equivalent_false(pred, gold):
    assert is_equivalent(pred, gold) is False


def test_is_equivalent_without_math_verify(monkeypatch):
    """If math-verify is missing, normalised strings / exact rationals still work; symbolic cases do not."""
    monkeypatch.setattr(verification, "_mv_module", None)
    assert verification._load_math_verify() is None
    assert is_equivalent("045", "45")
    assert is_equivalent("0.5", "\\frac{1}{2}")
    assert is_equivalent("\\dfrac{1}{2}", "1/2")
    assert not is_equivalent("540", "541")
    assert not is_equivalent("\\sqrt{2}", "2^{1/2}")  # needs math-verify
    assert math_reward(["Answer: 045", "Answer: 46"], ground_truth=["45", "45"]) == [1.0, 0.0]


@needs_math_verify
def test_is_equivalent_use_math_verify_flag():
    assert is_equivalent("\\sqrt{2}", "2^{1/2}", use_math_verify=True)
    assert not is_equivalent("\\sqrt{2}", "2^{1/2}", use_math_verify=False)


@needs_math_verify
def test_is_equivalent_off_main_thread():
    """math-verify's signal-based timeouts must not break when called from a worker thread."""
    results = {}

    def worker():
        try:
            results["value"] = (
                is_equivalent("0.5", "\\frac{1}{2}"),
                is_equivalent("\\sqrt{2}", "2^{1/2}"),
                is_equivalent("\\sqrt{2}", "3"),
                math_reward(["Answer: $2^{1/2}$"], ground_truth=["\\sqrt{2}"]),
            )
        except BaseException as e:  # noqa: BLE001  # pragma: no cover - reported by the assertion below
            results["error"] = e

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=60)
    assert "error" not in results, results.get("error")
    assert results["value"] == (True, True, False, [1.0])


@pytest.mark.parametrize("pred", ["10^{10^{10}}", "2^3^4^5", "9^{123456789}", "100000!", "1" * 500])
def test_pathological_answers_are_fast(pred):
    """Answers that could make sympy hang are never handed to it (no timeout protection off the main thread)."""
    results = {}

    def worker():
        start = time.perf_counter()
        results["value"] = is_equivalent(pred, "7")
        results["elapsed"] = time.perf_counter() - start

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert results.get("value") is False
    assert results["elapsed"] < 2.0


# ---------------------------------------------------------------------------------------------------------------------
# math_reward
# ---------------------------------------------------------------------------------------------------------------------


def test_math_reward_ground_truth_column():
    completions = ["Reasoning...\nAnswer: 540", "Answer: 541", "I give up.", "so \\boxed{\\frac{1}{2}}"]
    assert math_reward(completions, ground_truth=["540", "540", "540", "0.5"]) == [1.0, 0.0, 0.0, 1.0]


def test_math_reward_reward_model_column_and_chat_completions():
    completions = [
        [{"role": "assistant", "content": "Answer: 045"}],
        [{"role": "assistant", "content": "Answer: $\\frac{1}{3}$"}],
    ]
    reward_model = [
        {"ground_truth": "45", "style": "rule-lighteval/MATH_v2"},
        {"ground_truth": "0.5", "style": "rule-lighteval/MATH_v2"},
    ]
    assert math_reward(completions, reward_model=reward_model) == [1.0, 0.0]


def test_math_reward_none_rows():
    completions = ["Answer: 1", "Answer: 2", "Answer: 3", "Answer: 4", "Answer: 5"]
    ground_truth = ["1", None, "", None, None]
    reward_model = [None, {"ground_truth": "2"}, {"ground_truth": "3"}, {"ground_truth": ""}, None]
    # row 0: ground_truth; rows 1-2: fall back to reward_model; rows 3-4: no reference -> None
    assert math_reward(completions, ground_truth=ground_truth, reward_model=reward_model) == [
        1.0,
        1.0,
        1.0,
        None,
        None,
    ]
    assert math_reward(["Answer: 1"]) == [None]


def test_math_reward_trl_kwargs_and_logging():
    logged = {}
    out = math_reward(
        completions=["Answer: 7", "Answer: 8"],
        prompts=["p1", "p2"],
        completion_ids=[[1, 2], [3]],
        ground_truth=["7", ["9", "8"]],  # a list of acceptable answers
        trainer_state=None,
        log_extra=lambda name, values: logged.__setitem__(name, values),
    )
    assert out == [1.0, 1.0]
    assert logged["extracted_answer"] == ["7", "8"]
    assert logged["ground_truth"] == ["7", "9 | 8"]


def test_math_reward_length_mismatch():
    with pytest.raises(ValueError, match="ground_truth"):
        math_reward(["Answer: 1", "Answer: 2"], ground_truth=["1"])


def test_math_reward_name_and_pickle():
    assert math_reward.__name__ == "math_reward"
    assert pickle.loads(pickle.dumps(math_reward)) is math_reward


def test_paper_math_reward_gives_the_papers_values_with_math_rewards_grading():
    """+1 / -1 where math_reward gives 1 / 0 (the RPG authors' scorer returns 1.0 if correct else -1.0), None where
    it gives None; one grading (a wrong, a missing and an unreferenced answer alike)."""
    completions = ["Answer: 540", "Answer: 541", "I give up.", "so \\boxed{\\frac{1}{2}}", "Answer: 1"]
    ground_truth = ["540", "540", "540", "0.5", None]
    assert math_reward(completions, ground_truth=ground_truth) == [1.0, 0.0, 0.0, 1.0, None]
    assert paper_math_reward(completions, ground_truth=ground_truth) == [1.0, -1.0, -1.0, 1.0, None]
    assert paper_math_reward.__name__ == "paper_math_reward" and paper_math_reward.required_columns == ANSWER_COLUMNS
    assert pickle.loads(pickle.dumps(paper_math_reward)) is paper_math_reward
    assert get_reward_func("paper_math_reward") is paper_math_reward
    assert (math_reward.values, paper_math_reward.values) == ((1.0, 0.0), (1.0, -1.0))


def test_make_math_reward_takes_any_values_and_a_name():
    logged = {}
    graded = make_math_reward(correct=2.0, incorrect=-0.5, name="my_accuracy")
    assert graded(["Answer: 7", "Answer: 8"], answer=["7", "7"],
                  log_extra=lambda name, values: logged.__setitem__(name, values)) == [2.0, -0.5]
    assert graded.__name__ == "my_accuracy" and logged["extracted_answer"] == ["7", "8"]
    assert make_math_reward()(["Answer: 7", "Answer: 8"], answer=["7", "7"]) == [1.0, 0.0]  # math_reward's values
    with pytest.raises(ValueError, match=r"`correct`=0.0 must be greater than `incorrect`=1.0"):
        make_math_reward(correct=0.0, incorrect=1.0)
    with pytest.raises(ValueError, match=r"`incorrect`=nan is not allowed; it must be a finite number"):
        make_math_reward(incorrect=float("nan"))
    with pytest.raises(ValueError, match=r"`name`='my reward' is not allowed"):
        make_math_reward(name="my reward")


def test_completion_to_text():
    assert completion_to_text("abc") == "abc"
    assert completion_to_text([{"role": "assistant", "content": "x"}]) == "x"
    assert (
        completion_to_text(
            [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
        )
        == "ab"
    )
    assert completion_to_text([{"role": "assistant", "content": "a"}, {"role": "tool", "content": "t"}]) == "a"
    assert completion_to_text(None) == ""


# ---------------------------------------------------------------------------------------------------------------------
# overlong punishment
# ---------------------------------------------------------------------------------------------------------------------


def test_make_overlong_punishment():
    fn = make_overlong_punishment(max_completion_length=100, soft_punish_cache=20)
    assert fn.__name__ == "soft_overlong_punishment_reward"
    assert fn(completion_ids=[[1] * 50, [1] * 80, [1] * 90, [1] * 100, [1] * 101]) == pytest.approx(
        [0.0, 0.0, -0.5, -1.0, -1.0]
    )
    assert pickle.loads(pickle.dumps(fn))(completion_ids=[[1] * 90]) == pytest.approx([-0.5])
    with pytest.raises(ValueError):
        make_overlong_punishment(100, 200)


# ---------------------------------------------------------------------------------------------------------------------
# Reference answers and the shared scoring rule
# ---------------------------------------------------------------------------------------------------------------------


def test_reference_answer_reads_the_answer_columns_in_order():
    assert ANSWER_COLUMNS == ("ground_truth", "reward_model", "answer")
    assert reference_answer({"ground_truth": " 7 ", "reward_model": {"ground_truth": "8"}, "answer": "9"}) == "7"
    assert reference_answer({"ground_truth": "", "reward_model": {"ground_truth": "8"}, "answer": "9"}) == "8"
    assert reference_answer({"ground_truth": None, "reward_model": {"style": "rule"}, "answer": 9}) == "9"
    assert reference_answer({"answer": "12"}) == "12"
    assert reference_answer({"ground_truth": ["1", " ", None, "2"]}) == ["1", "2"]
    assert reference_answer({"ground_truth": [], "answer": "3"}) == "3"
    assert reference_answer({"prompt": "x", "solution": "4"}) is None
    assert reference_answer({"reward_model": None, "answer": "  "}) is None


def test_score_answer_and_score_completion():
    assert score_answer("42", "42") == 1.0
    assert score_answer("41", "42") == 0.0
    assert score_answer(None, "42") == 0.0  # no answer: wrong
    assert score_answer("42", None) is None  # no reference: not scored
    assert score_answer("42", ["", None]) is None
    assert score_answer("8", ["9", "8"]) == 1.0
    assert score_completion([{"role": "assistant", "content": "Answer: $\\frac{1}{2}$"}], "0.5") == 1.0
    assert score_completion("no answer", "1") == 0.0


def test_math_reward_answer_column():
    """A data set with a plain `answer` column is scored (as `examples/rpg_math.py` scores it)."""
    completions = ["Answer: 12", "Answer: 13", "\\boxed{5}"]
    assert math_reward(completions, answer=["12", "12", 5]) == [1.0, 0.0, 1.0]
    # ground_truth and reward_model come first
    assert math_reward(["Answer: 1", "Answer: 2"], ground_truth=["1", None],
                       reward_model=[None, {"ground_truth": "2"}], answer=["9", "9"]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="`answer` has 1 entries"):
        math_reward(["Answer: 1", "Answer: 2"], answer=["1"])


# ---------------------------------------------------------------------------------------------------------------------
# Reward functions by name, and the dataset columns they read
# ---------------------------------------------------------------------------------------------------------------------


def test_reward_registry_names_and_builds():
    assert {"math_reward", "paper_math_reward", "soft_overlong_punishment", "accuracy_reward",
            "reasoning_accuracy_reward", "think_format_reward"} <= set(REWARD_FUNCS)
    assert get_reward_func("math_reward") is math_reward
    punish = get_reward_func("soft_overlong_punishment", max_completion_length=16, soft_punish_cache=4)
    assert punish(completion_ids=[[1] * 12, [1] * 14]) == [0.0, -0.5]
    # a cache longer than the completion budget is capped to it
    capped = get_reward_func("soft_overlong_punishment", max_completion_length=8, soft_punish_cache=100)
    assert capped(completion_ids=[[1] * 4]) == [-0.5]
    import trl.rewards

    assert get_reward_func("accuracy_reward") is trl.rewards.accuracy_reward
    assert reward_columns(trl.rewards.accuracy_reward) == ("solution",)
    with pytest.raises(ValueError, match=r"Unknown reward function 'math_rewrd'.*Did you mean 'math_reward'\?"):
        get_reward_func("math_rewrd")


def test_register_reward_adds_a_named_builder():
    def build(*, max_completion_length, **settings):
        def budget_reward(completions, budget, **kwargs):
            return [float(max_completion_length) for _ in completions]

        return budget_reward

    register_reward("budget_reward", columns=("budget",), help="test")(build)
    try:
        func = get_reward_func("budget_reward", max_completion_length=7, soft_punish_cache=0)
        assert func(["a"], budget=[1]) == [7.0] and reward_columns(func) == ("budget",)
        with pytest.raises(ValueError, match="'budget'"):
            check_reward_columns([func], ["prompt"])
    finally:
        del REWARD_FUNCS["budget_reward"]


def test_the_training_api_does_not_import_the_toy_task():
    """The toy is not part of the training API: neither the rewards nor the trainer import it, and its `toy_reward`
    is a name of the command line (`trl_rpg.cli` registers it, lazily: the toy is imported when it is built)."""
    import subprocess
    import sys

    code = ("import sys, trl_rpg.rewards as r, trl_rpg.trainers.trainer, trl_rpg.evaluation.evaluate; "
            "assert 'toy_reward' not in r.REWARD_FUNCS, sorted(r.REWARD_FUNCS); "
            "import trl_rpg.cli; assert 'toy_reward' in r.REWARD_FUNCS; "
            "print('trl_rpg.toy' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_the_command_line_names_the_toy_reward():
    from trl_rpg import cli  # noqa: F401  (registers `toy_reward`)
    from trl_rpg.toy import toy_reward

    assert get_reward_func("toy_reward") is toy_reward
    assert reward_columns(toy_reward) == ("answer",)


def test_check_reward_columns_names_looked_for_and_present_columns():
    with pytest.raises(ValueError) as excinfo:
        check_reward_columns([math_reward], ["prompt", "solution"])
    message = str(excinfo.value)
    assert "'math_reward'" in message
    assert "['ground_truth', 'reward_model', 'answer']" in message  # looked for
    assert "['prompt', 'solution']" in message  # present
    for columns in (["prompt", "answer"], ["prompt", "ground_truth"], ["reward_model"]):
        check_reward_columns([math_reward], columns)  # any one of them is enough
    check_reward_columns(math_reward, ["answer"])  # a single function
    check_reward_columns([math_reward], None)  # unknown columns (streaming): not checked


def test_check_reward_columns_accepts_any_callable():
    import functools

    def undeclared(completions, **kwargs):
        return [0.0] * len(completions)

    class AsyncReward:
        required_columns = "label"

        async def __call__(self, completions, **kwargs):
            return [0.0] * len(completions)

    # functions without a declaration, model ids and partials of undeclared functions are not checked
    check_reward_columns([undeclared, "org/reward-model", functools.partial(undeclared)], ["prompt"])
    with pytest.raises(ValueError, match=r"'AsyncReward' reads the column 'label'"):
        check_reward_columns([undeclared, AsyncReward()], ["prompt"])
    # several functions missing their columns are all named
    with pytest.raises(ValueError, match=r"'math_reward'.*'AsyncReward'"):
        check_reward_columns([math_reward, AsyncReward()], ["prompt"])


def test_the_grading_examples_of_docs_rewards_md_are_what_paper_math_reward_gives():
    """docs/rewards.md contrasts trl-rpg's grading with the RPG authors' scorer on examples; its trl-rpg column is
    what `paper_math_reward` returns (a grading change that makes the page false fails here)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "rewards.md").read_text(encoding="utf-8")
    table = text[text.index("| completion | reference | authors | trl-rpg |"):]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| `")]
    examples = [(completion.strip("| `").replace("\\n", "\n"), reference.strip("`"), float(ours.strip(" |")))
                for completion, reference, _, ours in rows]
    assert len(examples) == 10
    for completion, reference, ours in examples:
        assert paper_math_reward([completion], ground_truth=[reference]) == [ours], (completion, reference)
