"""The vLLM backend of the benchmark evaluation (`evaluate_model(..., backend="vllm")`), with the fake vLLM of
tests/vllm_stub (tests/test_vllm_generation.py says why a stub package and how it is kept out of the other tests).

At the paper's scale (3,200 completions of up to 8k tokens per benchmark) the evaluation must be one vLLM call that
samples the k completions of every problem at once; these tests check that call (one `LLM.generate`, one
`SamplingParams(n=k)` per problem with the evaluation's settings), that each row gets a completion of its own
problem's prompt, and that greedy decoding gives the default backend's completions (same prompts, same
tokenization, same decoding). The default backend is unchanged (tests/test_evaluation.py).
"""

from __future__ import annotations

import string

import pytest
from _fake_vllm import installed

from trl_rpg.evaluation.evaluate import evaluate_model, load_benchmark


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A tiny model whose tokenizer covers the benchmarks' characters, saved (vLLM loads from a path)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    from trl_rpg.toy import build_model

    specials = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>"]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + sorted(set(string.printable)))},
                                         unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>", additional_special_tokens=specials[3:])
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    model = build_model(tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=0, intermediate_size=64,
                        num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=None,
                        tie_word_embeddings=False)
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id,
                                               eos_token_id=tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("eval_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), model, tokenizer


@pytest.fixture(scope="module")
def amc23():
    return load_benchmark("amc23")


def test_vllm_backend_samples_the_k_completions_of_each_problem_in_one_call(saved_model, amc23):
    path, _, tokenizer = saved_model
    with installed():
        from vllm import LLM

        llm = LLM(model=path, seed=0)
        stats = evaluate_model(llm, tokenizer, amc23, backend="vllm", max_new_tokens=6, temperature=0.9, top_p=0.95,
                               top_k=10, num_samples=4, max_problems=3, seed=7)
    ((prompts, params),) = llm.generate_calls  # one call
    assert prompts == 3 and [p.n for p in params] == [4, 4, 4]
    assert {(p.temperature, p.top_p, p.top_k, p.max_tokens) for p in params} == {(0.9, 0.95, 10, 6)}
    assert [p.seed for p in params] == [7, 8, 9]
    assert (stats["k"], stats["num_problems"], stats["num_samples"]) == (4, 3, 12)
    assert stats["generation"]["backend"] == "vllm"
    # row r of problem p holds the (r mod 4)-th completion of p's prompt, decoded
    first_rows = {}
    for row in amc23.select_columns(["problem_id", "prompt"]):
        first_rows.setdefault(row["problem_id"], row)
    for p, request in enumerate(llm.requests):
        text = tokenizer.apply_chat_template(first_rows[p]["prompt"], tokenize=False, add_generation_prompt=True)
        assert request.prompt_token_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
        assert stats["completions"][4 * p:4 * p + 4] == [tokenizer.decode(c, skip_special_tokens=True)
                                                         for c in request.completions]
        assert stats["completion_lengths"][4 * p:4 * p + 4] == [len(c) for c in request.completions]
    assert len({tuple(c) for r in llm.requests for c in r.completions}) > 3  # sampled, not one completion copied


def test_vllm_backend_decodes_greedily_as_the_default_backend(saved_model, amc23):
    """temperature=0: both backends give every row the same completion (the engine is built from the path)."""
    path, model, tokenizer = saved_model
    settings = dict(max_new_tokens=8, temperature=0.0, num_samples=2, max_problems=3, seed=0)
    with installed():
        vllm = evaluate_model(path, tokenizer, amc23, backend="vllm", **settings)
    default = evaluate_model(model, tokenizer, amc23, **settings)
    assert vllm["completions"] == default["completions"]
    assert vllm["truncated_fraction"] == default["truncated_fraction"]
    assert vllm["generation"]["backend"] == "vllm" and default["generation"]["backend"] == "transformers"


def test_vllm_backend_errors_name_what_to_do(saved_model, amc23):
    path, model, tokenizer = saved_model
    with pytest.raises(ImportError, match="backend='transformers'"):  # vLLM not installed
        evaluate_model(path, tokenizer, amc23, backend="vllm", max_new_tokens=2, max_problems=1)
    with installed(), pytest.raises(TypeError, match="path of a saved model"):
        evaluate_model(model, tokenizer, amc23, backend="vllm", max_new_tokens=2, max_problems=1)
    with pytest.raises(ValueError, match="backend='vlm' is not allowed"):
        evaluate_model(model, tokenizer, amc23, backend="vlm", max_new_tokens=2, max_problems=1)


def test_rpg_math_evaluates_with_vllm_by_flag(saved_model, tmp_path):
    """`examples/rpg_math.py --eval_backend vllm`: the saved model goes to vLLM by its path, and the summary holds
    the k and the problems asked for."""
    from test_examples import _load_rpg_math

    path, _, _ = saved_model
    m = _load_rpg_math()
    script_args, training_args, model_args = m.make_parser().parse_args_and_config(
        ["--model_name_or_path", path, "--output_dir", str(tmp_path), "--use_cpu", "True", "--bf16", "False",
         "--eval_backend", "vllm", "--eval_benchmarks", "amc23", "--eval_num_samples", "2", "--eval_max_problems", "2",
         "--eval_max_new_tokens", "4"])
    model, tokenizer = m._load_for_eval(path, model_args, use_peft=False, backend=script_args.eval_backend)
    assert model == path
    with installed():
        summary = m.evaluate(model, tokenizer, script_args, training_args, "after")
    assert (summary["amc23"]["k"], summary["amc23"]["num_problems"]) == (2, 2)
