"""The model card cites the RPG paper and names the divergence, estimator and reference schedule; `push_to_hub`
uploads it with the model, tested offline (huggingface_hub's `create_repo` / `upload_folder` are replaced)."""

import os
from types import SimpleNamespace

import huggingface_hub
import pytest
from _tiny import cpu_args, length_reward, save_tiny_model, tiny_dataset
from huggingface_hub import ModelCard

from trl_rpg import RPGConfig, RPGTrainer
from trl_rpg.trainers.model_card import markdown_text, python_string, rpg_settings


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("card") / "model"))


@pytest.fixture
def fake_hub(monkeypatch):
    """Record what `Trainer.push_to_hub` would create and upload; fail on any other Hub call it makes."""
    calls = {"create_repo": [], "upload_folder": []}

    def create_repo(self, repo_id, **kwargs):
        calls["create_repo"].append({"repo_id": repo_id, **kwargs})
        return SimpleNamespace(repo_id=repo_id, url=f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        files = {}
        for root, _, names in os.walk(folder_path):
            for name in names:
                path = os.path.join(root, name)
                files[os.path.relpath(path, folder_path)] = path
        card = None
        if "README.md" in files:
            with open(files["README.md"], encoding="utf-8") as f:
                card = f.read()
        calls["upload_folder"].append({"repo_id": repo_id, "folder_path": folder_path, "files": sorted(files),
                                       "card": card, **kwargs})
        return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0", oid="0")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return calls


def _train(model_path, output_dir, **overrides):
    args = RPGConfig(**cpu_args(output_dir, max_steps=1, steps_per_generation=2, **overrides))
    trainer = RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset())
    trainer.train()
    return trainer


def _assert_rpg_card(text: str, divergence: str, estimator: str, reference: str, beta: float):
    assert "2505.17508" in text
    assert "On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning" in text
    assert "@inproceedings{zhang2026rpg" in text  # the BibTeX entry
    assert f"| divergence | `{divergence}` |" in text
    assert f"| estimator | `{estimator}` |" in text
    assert f"| reference policy | `{reference}` |" in text
    assert f"| beta | `{beta}` |" in text


def test_model_card_cites_rpg_and_names_the_settings(model_path, tmp_path):
    out = tmp_path / "out"
    trainer = _train(model_path, out, rpg_divergence="ufkl", rpg_estimator="differentiable",
                     rpg_reference="periodic", rpg_reference_update_steps=1, beta=0.01, epsilon=0.15,
                     epsilon_high=0.35, rpg_dual_clip_c=4.0, loss_type="dr_grpo")
    trainer.create_model_card(model_name="rpg-tiny", dataset_name="tiny-arithmetic")
    path = out / "README.md"
    assert path.exists()
    text = path.read_text(encoding="utf-8")
    _assert_rpg_card(text, "ufkl", "differentiable", "periodic", 0.01)
    assert "| clip (eps_low, eps_high, c) | `(0.15, 0.35, 4.0)` |" in text
    assert "| aggregation (`loss_type`) | `dr_grpo` |" in text
    card = ModelCard.load(str(path))
    assert {"rpg", "trl"} <= set(card.data.tags)
    assert card.data.model_name == "rpg-tiny" and card.data.datasets == "tiny-arithmetic"
    # the card is written once, not duplicated by a second call
    trainer.create_model_card(model_name="rpg-tiny")
    assert path.read_text(encoding="utf-8").count("## RPG settings") == 1


def test_push_to_hub_uploads_model_and_rpg_card_offline(model_path, tmp_path, fake_hub):
    out = tmp_path / "push"
    trainer = _train(model_path, out, push_to_hub=True, hub_model_id="someone/rpg-tiny", hub_strategy="end")
    assert fake_hub["create_repo"] and fake_hub["create_repo"][0]["repo_id"] == "someone/rpg-tiny"

    trainer.push_to_hub(commit_message="RPG run", dataset_name="tiny-arithmetic")
    assert len(fake_hub["upload_folder"]) == 1
    upload = fake_hub["upload_folder"][0]
    assert upload["repo_id"] == "someone/rpg-tiny" and upload["folder_path"] == str(out)
    assert upload["commit_message"] == "RPG run"
    assert any(p.startswith("checkpoint-") for p in upload["ignore_patterns"])
    assert {"README.md", "config.json", "model.safetensors", "tokenizer_config.json"} <= set(upload["files"])
    _assert_rpg_card(upload["card"], "urkl", "reinforce", "sampling", 1e-4)  # RPGConfig's defaults
    assert "rpg" in upload["card"].split("---")[1]  # the tags in the YAML header
    assert 'model="someone/rpg-tiny"' in upload["card"]  # the quick start loads what was pushed


def _links(text: str) -> list[str]:
    import re

    return re.findall(r"\]\((https://huggingface\.co/[^)]*)\)", text)


def test_card_of_a_local_model_and_local_data_has_no_broken_links(model_path, tmp_path):
    """Trained from a local folder on a local file with a space in its name, not pushed: no link to a Hub page that
    cannot exist, and a quick start that loads the trained model from where it was saved."""
    out = tmp_path / "out"
    trainer = _train(model_path, out)
    trainer.create_model_card(model_name="rpg-tiny", dataset_name=str(tmp_path / "my data.parquet"))
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "None" not in text.split("## Training procedure")[0]
    assert f"fine-tuned version of the local model {markdown_text(model_path)}.\n" in text
    assert f"trained on {markdown_text(str(tmp_path / 'my data.parquet'))} using" in text
    assert f'model="{out}"' in text
    assert all(" " not in link and "None" not in link and str(tmp_path) not in link for link in _links(text))
    assert ModelCard.load(str(out / "README.md")).data.datasets is None  # no invalid Hub data set id in the metadata


def test_card_of_a_model_built_in_code(tmp_path):
    from _tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    model.config._name_or_path = ""
    args = RPGConfig(**cpu_args(tmp_path / "out", max_steps=1, steps_per_generation=2))
    trainer = RPGTrainer(model=model, processing_class=tokenizer, reward_funcs=length_reward, args=args,
                         train_dataset=tiny_dataset())
    trainer.create_model_card(model_name="built")
    text = (tmp_path / "out" / "README.md").read_text(encoding="utf-8")
    assert "fine-tuned version of a model built in code" in text
    assert "huggingface.co/None" not in text and 'model="None"' not in text


def _card_args(tmp_path, **overrides):
    values = dict(rpg_divergence="rkl", rpg_estimator="reinforce", rpg_reference="adaptive", epsilon=0.1,
                  epsilon_high=0.3, rpg_dual_clip_c=None, loss_type="bnpo", beta=0.25, steps_per_generation=8,
                  gradient_accumulation_steps=2, num_iterations=1, scale_rewards="group",
                  output_dir=str(tmp_path / "out"))
    return SimpleNamespace(**{**values, **overrides})


def test_hub_names_keep_their_links(model_path, tmp_path):
    """A Hub base model and data set are linked (and in the metadata), as TRL's card links them; anything
    `huggingface_hub.utils.validate_repo_id` refuses, a local path or a data file is not."""
    from trl_rpg.trainers.model_card import hub_repo_id, render

    assert hub_repo_id("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B" and hub_repo_id("gsm8k") == "gsm8k"
    assert hub_repo_id("data.parquet") is None and hub_repo_id("my data") is None and hub_repo_id(model_path) is None
    for refused in ("a--b", "a..b", "org/a/b", "model.git", "-a", "x" * 97, "Qwén/model", "", None):
        assert hub_repo_id(refused) is None, refused  # validate_repo_id's rule (ASCII only: the Hub's)
    text = str(render(_card_args(tmp_path), base_model="Qwen/Qwen3-1.7B", model_name="qwen-rpg",
                      dataset_name="gsm8k", load_as="me/qwen-rpg", tags=["generated_from_trainer", "rpg"]))
    assert ("This model is a fine-tuned version of [Qwen/Qwen3-1.7B](https://huggingface.co/Qwen/Qwen3-1.7B) on the "
            "[gsm8k](https://huggingface.co/datasets/gsm8k) dataset.\n") in text
    assert 'model="me/qwen-rpg"' in text
    card = ModelCard(text)
    assert (card.data.base_model, card.data.datasets, card.data.library_name) == (
        "Qwen/Qwen3-1.7B", "gsm8k", "transformers")


def test_settings_rows_show_each_field(tmp_path):
    """Every row of the settings table reads its own field (distinct values, so a row showing another field's value
    is caught), batch reuse and `scale_rewards` included, and says what the saved output is."""
    rows = [line for line in rpg_settings(_card_args(tmp_path), 0.25).splitlines()
            if line.startswith("| ") and "---" not in line]
    assert rows[1:] == ["| divergence | `rkl` |", "| estimator | `reinforce` |", "| reference policy | `adaptive` |",
                        "| beta | `0.25` |", "| clip (eps_low, eps_high, c) | `(0.1, 0.3, None)` |",
                        "| aggregation (`loss_type`) | `bnpo` |",
                        "| batch reuse (optimizer steps per generation batch) | `4` (steps_per_generation=8, "
                        "gradient_accumulation_steps=2, num_iterations=1) |",
                        "| advantage (`scale_rewards`) | `group`: divided by the group's std |",
                        "| saved output | full model weights |"]
    reused = rpg_settings(_card_args(tmp_path, steps_per_generation=2, num_iterations=3, scale_rewards="none"), 0.25,
                          adapter=True)
    assert "| batch reuse (optimizer steps per generation batch) | `3` (" in reused
    assert "| advantage (`scale_rewards`) | `none`: reward - group mean, not divided by the std |" in reused
    assert "| saved output | LoRA adapter (PEFT): load it on top of the base model |" in reused


def test_a_lora_run_says_its_output_is_an_adapter(model_path, tmp_path):
    from peft import LoraConfig

    out = tmp_path / "lora"
    args = RPGConfig(**cpu_args(out, max_steps=1, steps_per_generation=2))
    trainer = RPGTrainer(model=model_path, reward_funcs=length_reward, args=args, train_dataset=tiny_dataset(),
                         peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    # save_strategy="no": no checkpoint wrote a card; the final save writes RPG's, not PEFT's blank one (issue 36 s.3)
    trainer.save_model()
    saved = (out / "README.md").read_text(encoding="utf-8")
    assert "This repository holds a LoRA adapter (PEFT), not full weights" in saved and "## RPG settings" in saved
    assert "[More Information Needed]" not in saved  # PEFT's template
    trainer.create_model_card(model_name="rpg-lora")
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "This repository holds a LoRA adapter (PEFT), not full weights" in text
    assert "| saved output | LoRA adapter (PEFT): load it on top of the base model |" in text
    assert ModelCard.load(str(out / "README.md")).data.library_name == "peft" and "- PEFT: " in text


def test_the_card_is_rpgs_own_and_keeps_what_trls_card_carries(model_path, tmp_path, monkeypatch):
    """RPG's template, not TRL's card edited afterwards (TRL's renderer may fail or change: the card is the same),
    with TRL's tags (the user's, the trainer's, `generated_from_trainer`), tracker links, framework versions and both
    citations."""
    import trl.trainer.base_trainer

    def no_trl_card(*args, **kwargs):
        raise AssertionError("TRL's card renderer was called")

    monkeypatch.setattr(trl.trainer.base_trainer, "generate_model_card", no_trl_card)
    monkeypatch.setattr("trl_rpg.trainers.model_card.tracker_urls", lambda: {"trackio": "https://me-space.hf.space?project=p"})
    out = tmp_path / "own"
    trainer = _train(model_path, out)
    trainer.create_model_card(model_name="rpg-tiny", tags="my-tag")
    text = (out / "README.md").read_text(encoding="utf-8")
    tags = ModelCard.load(str(out / "README.md")).data.tags
    assert tags[0] == "generated_from_trainer" and {"my-tag", "rpg", "trl"} <= set(tags)
    assert "trackio:https://me-space.hf.space?project=p" in tags
    assert "alt=\"Visualize in Trackio\"" in text and "](https://me-space.hf.space?project=p)" in text
    import importlib.metadata

    for package, label in (("trl", "TRL"), ("trl-rpg", "trl-rpg"), ("transformers", "Transformers"),
                           ("torch", "Pytorch")):
        assert f"- {label}: {importlib.metadata.version(package)}\n" in text
    assert "@inproceedings{zhang2026rpg" in text and "@software{vonwerra2020trl" in text
    assert "| saved output | full model weights |" in text


EVIL_MODEL = "evil<script>alert(1)</script>\n# heading"
EVIL_RUN = "run<script>alert(2)</script>\n# heading [x](https://example.com) *b*"
EVIL_DATA = "data<img src=x onerror=alert(3)>\n# heading | cell"


def _body(text: str) -> str:
    """The card without its YAML metadata."""
    assert text.startswith("---\n")
    return text.split("\n---\n", 1)[1]


def test_names_are_escaped_in_the_card(tmp_path):
    """A base model, model name, data set and output folder whose names hold HTML, Markdown and line breaks: the
    card's text has no tag and no heading of theirs, each name reads as itself, the metadata keeps the names
    verbatim, and the quick start is valid Python loading the output folder."""
    import ast

    from _tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer)
    model.config._name_or_path = EVIL_MODEL  # not a folder: TRL links it
    out = tmp_path / 'out "q" `tick` \\ x'
    args = RPGConfig(**cpu_args(out, max_steps=1, steps_per_generation=2))
    trainer = RPGTrainer(model=model, processing_class=tokenizer, reward_funcs=length_reward, args=args,
                         train_dataset=tiny_dataset())
    trainer.create_model_card(model_name=EVIL_RUN, dataset_name=EVIL_DATA)
    text = (out / "README.md").read_text(encoding="utf-8")
    body = _body(text)
    for tag in ("<script", "</script", "<img", "](https://example.com)"):
        assert tag not in body
    headings = [line for line in body.splitlines() if line.lstrip(" ").startswith("#")]
    assert all("heading" not in line or line.startswith("# Model Card for ") for line in headings), headings
    assert body.count("# Model Card for ") == 1
    assert ("# Model Card for run&lt;script&gt;alert\\(2\\)&lt;/script&gt;\\\\n\\# heading "
            "\\[x\\]\\(https://example.com\\) \\*b\\*\n") in body
    assert ("fine-tuned version of the local model evil&lt;script&gt;alert\\(1\\)&lt;/script&gt;\\\\n\\# "
            "heading") in body
    assert "trained on data&lt;img src=x onerror=alert\\(3\\)&gt;\\\\n\\# heading \\| cell using" in body
    assert "huggingface.co/evil" not in body
    # the quick start: one line, valid Python, loading the output folder; the code block is not closed early
    (line,) = [line for line in body.splitlines() if "pipeline(" in line]
    call = ast.parse(line.strip()).body[0].value
    assert ast.literal_eval(call.keywords[0].value) == str(out)
    assert body.split("## Training procedure")[0].count("```") == 2
    card = ModelCard.load(str(out / "README.md"))
    assert card.data.model_name == EVIL_RUN and card.data.base_model == EVIL_MODEL


def test_escaped_names_render_as_themselves():
    """Rendered by a CommonMark renderer with raw HTML on, an escaped name is one paragraph of plain text that reads
    as the name (a line break shown as `\\n`); the Python literal evaluates back to the name."""
    import ast

    markdown_it = pytest.importorskip("markdown_it")
    md = markdown_it.MarkdownIt("commonmark")
    for name in (EVIL_MODEL, EVIL_RUN, EVIL_DATA, "a_b*c*_d `e` ~~f~~ $x$ &amp; \\ \u202eg\u2028h", "/tmp/my data"):
        tokens = md.parse(f"Trained on {markdown_text(name)} here.")
        assert [t.type for t in tokens] == ["paragraph_open", "inline", "paragraph_close"], name
        children = tokens[1].children
        assert {t.type for t in children} == {"text"}, (name, [t.type for t in children])
        shown = "".join(t.content for t in children)
        expected = "".join("\\n" if ch == "\n" else "\\u202e" if ch == "\u202e" else "\\u2028" if ch == "\u2028"
                           else ch for ch in name)
        assert shown == f"Trained on {expected} here.", name
        assert ast.literal_eval(python_string(name)) == name and "`" not in python_string(name)
        assert "\n" not in python_string(name)
