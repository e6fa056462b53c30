"""Data set checks that fail early with an error naming the culprit: rows, columns, sizes, the prompts' tokenization.

`validate_train_dataset`, `validate_eval_dataset` and `validate_dataset_size` run before any model is loaded;
`validate_tokenized_prompts` needs the tokenizer and runs right after it is loaded. (What reward functions are
called with, and what they return, is checked by `trl_rpg.run.reward_calls`.)
"""

from __future__ import annotations

import functools
import logging
import os

from ..rewards.registry import check_reward_columns

logger = logging.getLogger(__name__)

#: `validate_tokenized_prompts` tokenizes at most this many rows by default (see its docstring for the cost).
MAX_TOKENIZED_ROWS = 50_000


# ----------------------------------------------------------------------------------------------------------------
# Data sets
# ----------------------------------------------------------------------------------------------------------------


def validate_train_dataset(dataset, name: str = "train_dataset", max_rows: int | None = None) -> None:
    """Check that `dataset` has a usable `prompt` column: non-empty text or a well-formed conversation.

    Raises `ValueError` naming the data set, the row and what is wrong. For an iterable (streaming) data set the column
    names (when known) and the first row are checked; the first row is read through `dataset.take(1)`, which starts a
    fresh iteration and leaves the data set itself untouched. An empty streaming data set is an error.
    """
    if dataset is None:
        return
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns:
        raise ValueError(_no_prompt_column(name, columns))
    if not hasattr(dataset, "__len__"):
        _validate_first_streamed_row(dataset, name)
        return
    if columns is None:
        return
    prompts = dataset["prompt"] if max_rows is None else dataset.select(range(min(max_rows, len(dataset))))["prompt"]
    for row, prompt in enumerate(prompts):
        _check_prompt(prompt, name, row)


def validate_eval_dataset(eval_dataset, reward_funcs) -> None:
    """Check an evaluation set as the training set is checked, before any model is loaded: a usable `prompt` column
    (`validate_train_dataset`) and the columns the reward functions read (`rewards.check_reward_columns`: without
    them a function scores nothing, and `eval_reward` silently reports the other functions alone). A dict of data
    sets (TRL evaluates each under its key) is checked set by set, each named by its key in the error."""
    named = eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]
    for key, dataset in named:
        name = "eval_dataset" if key is None else f"eval_dataset[{key!r}]"
        validate_train_dataset(dataset, name)
        check_reward_columns(reward_funcs, getattr(dataset, "column_names", None), name)


def validate_inputs(train_dataset, eval_dataset, reward_funcs, args) -> None:
    """What a trainer checks before any model is loaded: the output folder is not another run's
    (`check_output_dir_free`), the training set's prompts (`validate_train_dataset`) and size
    (`validate_dataset_size`), the columns its reward functions read (`rewards.check_reward_columns`), the evaluation
    set(s) (`validate_eval_dataset`)."""
    check_output_dir_free(args.output_dir)
    validate_train_dataset(train_dataset)
    validate_dataset_size(train_dataset, args)
    check_reward_columns(reward_funcs, getattr(train_dataset, "column_names", None))
    validate_eval_dataset(eval_dataset, reward_funcs)


def check_output_dir_free(output_dir: str | None) -> None:
    """Refuse, before the model and data load, an `output_dir` whose lock another run holds (`OutputDirBusy`, as
    `train()` would after them). One process only: the processes of a run take the lock together in `train()`, and
    one still loading could find its own run's lock, just taken by the main process."""
    from ..run.checkpoint.lock import check_output_dir_free as check_free

    if output_dir and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        check_free(output_dir)


def _no_prompt_column(name, columns) -> str:
    return (f"`{name}` has no 'prompt' column (columns: {list(columns)}). RPGTrainer, like GRPOTrainer, needs a "
            "'prompt' column of strings or of chat messages.")


def _validate_first_streamed_row(dataset, name) -> None:
    """Check the first row of a streaming data set (its columns may be unknown until a row is read)."""
    take = getattr(dataset, "take", None)
    if take is None:
        return
    first = next(iter(take(1)), None)
    if first is None:
        raise ValueError(f"`{name}` is empty: the streaming data set yielded no rows.")
    if "prompt" not in first:
        raise ValueError(_no_prompt_column(name, list(first)))
    _check_prompt(first["prompt"], name, 0)


def _check_prompt(prompt, name, row):
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError(f"`{name}` row {row}: the prompt is empty.")
        return
    if isinstance(prompt, (list, tuple)):
        if len(prompt) == 0:
            raise ValueError(f"`{name}` row {row}: the conversational prompt has no messages.")
        for i, message in enumerate(prompt):
            _check_message(message, name, row, i)
        if all(not _content_text(m["content"]).strip() for m in prompt):
            raise ValueError(f"`{name}` row {row}: every message of the conversational prompt is empty.")
        return
    raise ValueError(f"`{name}` row {row}: the prompt must be a string or a list of chat messages, got "
                     f"{type(prompt).__name__}.")


def _check_message(message, name, row, index):
    """What is wrong whatever the chat template: not a dict, no 'role' or 'content', a role that is not a non-empty
    string, `content: None` outside a tool-calling turn. Which roles exist is the chat template's business (Llama 3.1
    has 'ipython', others 'function' or 'observation'): any role is accepted here, and `validate_tokenized_prompts`
    names the row of a message the template refuses."""
    if not isinstance(message, dict) or "role" not in message or "content" not in message:
        raise ValueError(f"`{name}` row {row}, message {index}: each message must be a dict with 'role' and "
                         f"'content', got {message!r:.200}.")
    if not isinstance(message["role"], str) or not message["role"].strip():
        raise ValueError(f"`{name}` row {row}, message {index}: the role must be a non-empty string (such as "
                         f"'system', 'user', 'assistant' or 'tool'), got {message['role']!r:.100}.")
    if message["content"] is None and not message.get("tool_calls"):
        # A chat template would render None as the text "None". (An assistant turn that only calls tools may have
        # no content.)
        raise ValueError(f"`{name}` row {row}, message {index}: 'content' is None; it must be a string or a list "
                         "of content blocks (use '' for an empty message).")


def _content_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal content blocks
        return " ".join(str(block.get("text", "<non-text>")) if isinstance(block, dict) else str(block)
                        for block in content)
    return str(content)


def minimum_train_prompts(args) -> int:
    """Number of distinct prompts one generation batch draws: `generation_batch_size // num_generations`.

    TRL's `RepeatSampler` cuts the (shuffled) prompt indices into chunks of this many and drops an incomplete last
    chunk, so a data set with fewer prompts yields no batch at all. `generation_batch_size` is global
    (`per_device_train_batch_size * num_processes * steps_per_generation`): all processes share one sampler and
    each takes its slice of the batch, so the minimum does not change with the number of processes at a fixed global
    batch.
    """
    return args.generation_batch_size // args.num_generations


def validate_dataset_size(dataset, args, name: str = "train_dataset") -> None:
    """Raise `ValueError` if `dataset` has fewer prompts than one generation batch needs (it would train 0 steps).

    Cheap and model-free: call it before the model is loaded. A data set without a length (streaming) is skipped.
    """
    if dataset is None:
        return
    try:
        size = len(dataset)
    except TypeError:  # an iterable (streaming) data set: its size is unknown
        return
    needed = minimum_train_prompts(args)
    if size >= needed:
        return
    what = "is empty (0 prompts)" if size == 0 else f"has {size} prompts"
    raise ValueError(f"`{name}` {what}, but one generation batch needs {needed} distinct prompts, so training would "
                     f"run 0 steps. {_batch_size_explanation(args, needed)}")


def _batch_size_explanation(args, needed: int) -> str:
    P, S, G = args.per_device_train_batch_size, args.steps_per_generation, args.num_generations
    W = args.generation_batch_size // (P * S)
    text = (f"generation_batch_size = per_device_train_batch_size ({P}) x processes ({W}) x steps_per_generation "
            f"({S}) = {args.generation_batch_size} completions = {needed} prompts x num_generations ({G}); TRL's "
            "sampler drops an incomplete generation batch. Add prompts, or lower per_device_train_batch_size, the "
            "number of processes")
    reuse = getattr(args, "rpg_generation_reuse", None)
    accumulation = args.gradient_accumulation_steps
    if reuse is not None and reuse > 1 and args.num_iterations == 1 and reuse * accumulation == S:
        return (f"{text}, gradient_accumulation_steps or rpg_generation_reuse (steps_per_generation {S} = "
                f"rpg_generation_reuse {reuse} x gradient_accumulation_steps {accumulation}: RPG reuses each "
                f"generation batch for {reuse} optimizer steps, so it needs {reuse}x the prompts of GRPOTrainer, "
                "whose default is steps_per_generation = gradient_accumulation_steps).")
    return f"{text} or steps_per_generation (or generation_batch_size)."


def validate_tokenized_prompts(dataset, processing_class, *, tools=None, chat_template=None,
                               chat_template_kwargs=None, name: str = "train_dataset",
                               max_rows: int | None = MAX_TOKENIZED_ROWS, batch_size: int = 1024) -> None:
    """Raise `ValueError` naming the first row whose prompt tokenizes to no tokens.

    TRL cannot generate from an empty prompt: when every prompt of a batch is empty `generate` fails with
    `IndexError: index -1 is out of bounds` (`attention_mask[:, -1]` of a width-0 batch), when the first one is
    empty the padded batch is float and the embedding fails, and otherwise the row is generated from a fully
    masked prompt. The prompts are tokenized exactly as `GRPOTrainer._tokenize_prompts` does: plain text with
    `processing_class(text=...)`, conversations with `apply_chat_template(..., add_generation_prompt=True,
    tokenize=True)` and the trainer's `tools`, `chat_template` and `chat_template_kwargs`.

    Needs the tokenizer, so it runs once the trainer has loaded it. Plain-text prompts need no pass when the tokenizer
    adds a special token (BOS) to every text, even the empty one. Otherwise the first `max_rows` rows are tokenized
    in batches (all with `None`; a warning names how many were left unchecked): about 10 s per 100k short prompts
    with a character-level tokenizer on one CPU core. Skipped for streaming data sets and for processors that are
    not tokenizers (vision-language models, whose prompts TRL also converts to content blocks).
    """
    from transformers import PreTrainedTokenizerBase

    if dataset is None or not hasattr(dataset, "__len__") or len(dataset) == 0:
        return
    if not isinstance(processing_class, PreTrainedTokenizerBase):
        return
    first = dataset[0]["prompt"]
    if isinstance(first, str) and len(processing_class(text=[""])["input_ids"][0]) > 0:
        return  # every text gets the special tokens: none is empty
    rows = len(dataset) if max_rows is None else min(max_rows, len(dataset))
    if rows < len(dataset):
        logger.warning("validate_tokenized_prompts: checked the first %d of the %d prompts of `%s` for prompts that "
                       "tokenize to nothing (max_rows=%d).", rows, len(dataset), name, max_rows)
    for start in range(0, rows, batch_size):
        prompts = list(dataset[start:min(start + batch_size, rows)]["prompt"])
        tokenize = functools.partial(_tokenize_like_trl, processing_class=processing_class, tools=tools,
                                     chat_template=chat_template, chat_template_kwargs=chat_template_kwargs or {})
        try:
            ids = tokenize(prompts)
        except Exception as error:  # the chat template refused a message (a role it does not know, ...)
            _raise_for_the_refused_row(prompts, tokenize, error, name, start)
            raise
        for offset, prompt_ids in enumerate(ids):
            if len(prompt_ids) == 0:
                raise ValueError(f"`{name}` row {start + offset}: the prompt {prompts[offset]!r:.200} tokenizes to no "
                                 "tokens (with the chat template and tokenizer the trainer uses); generation needs at "
                                 "least one prompt token. Remove the row or fix its text.")


def _raise_for_the_refused_row(prompts, tokenize, error, name, start):
    """Tokenize the rows of a batch the chat template refused one by one, and raise `ValueError` naming the first
    row it refuses and its error (a batch that fails while each row passes returns, for the caller to re-raise)."""
    for offset, prompt in enumerate(prompts):
        try:
            tokenize([prompt])
        except Exception as row_error:
            raise ValueError(f"`{name}` row {start + offset}: the chat template refuses the prompt {prompt!r:.200} "
                             f"({type(row_error).__name__}: {row_error}). Fix the row, or use a chat template that "
                             "accepts its roles and content.") from error


def _tokenize_like_trl(prompts, processing_class, tools, chat_template, chat_template_kwargs):
    """Token ids of `prompts` as `GRPOTrainer._tokenize_prompts` computes them (text-only tokenizers)."""
    if isinstance(prompts[0], (list, tuple)):
        return processing_class.apply_chat_template(
            conversation=prompts, tools=tools or None, chat_template=chat_template, add_generation_prompt=True,
            tokenize=True, return_dict=True, **chat_template_kwargs)["input_ids"]
    return processing_class(text=prompts)["input_ids"]
