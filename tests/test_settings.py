"""The config parser (gptkit/base/settings.py): literal-only config files, typed --key=value overrides, presets built on
a base, one-line errors, even for input nested too deeply for Python's parsers."""

import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal, Optional

import pytest

import plot
from conftest import REPO, assert_one_error_line, run_script
from gptkit.base.errors import UserError
from gptkit.base.settings import coerce, flatten, parse_config, resumed, settings
from gptkit.training.train_config import TrainConfig
from model import GPTConfig


def write(tmp_path, text, name="cfg.py"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults_without_arguments():
    cfg = parse_config(TrainConfig, [])
    assert cfg == TrainConfig()


def test_types_and_precedence(tmp_path):
    path = write(tmp_path, "batch_size = 4\nn_layer = 3\ndropout = 0.2\nout_dir = 'from-file'\n"
                           "compile = True\n'''a docstring is fine'''\n")
    cfg = parse_config(TrainConfig, [path, "--dropout=0", "--compile=false", "--max_iters=1e4",
                                     "--batch_size", "8", "--wandb_run_name=123", "--learning_rate=3e-4"])
    assert cfg.model.dropout == 0.0 and isinstance(cfg.model.dropout, float)
    assert cfg.compile is False
    assert cfg.max_iters == 10000 and isinstance(cfg.max_iters, int)
    assert cfg.batch_size == 8  # the later argument wins over the file
    assert cfg.wandb_run_name == "123" and isinstance(cfg.wandb_run_name, str)
    assert cfg.learning_rate == 3e-4
    assert cfg.model.n_layer == 3 and cfg.out_dir == "from-file"  # untouched file values stay


def test_file_after_argument_wins(tmp_path):
    path = write(tmp_path, "batch_size = 4\n")
    assert parse_config(TrainConfig, ["--batch_size=9", path]).batch_size == 4
    assert parse_config(TrainConfig, [path, "--batch_size=9"]).batch_size == 9


@pytest.mark.parametrize("argv,expected", [
    (["--compile"], True),  # a bare flag means True
    (["--compile", "no"], False),
    (["--compile=1"], True),
    (["--compile=True"], True),
    (["--compile=off"], False),
])
def test_bool_forms(argv, expected):
    assert parse_config(TrainConfig, argv).compile is expected


def test_bare_bool_flag_before_config_file(tmp_path):
    path = write(tmp_path, "batch_size = 5\n")
    cfg = parse_config(TrainConfig, ["--compile", path])
    assert cfg.compile is True and cfg.batch_size == 5


def test_strings_keep_their_text():
    cfg = parse_config(TrainConfig, ["--out_dir=out-1", "--wandb_run_name='quoted'", "--dataset", "my set"])
    assert cfg.out_dir == "out-1"
    assert cfg.wandb_run_name == "quoted"
    assert cfg.dataset == "my set"


@pytest.mark.parametrize("arg,close", [("--n_layers=2", "n_layer"), ("--learnig_rate=1e-3", "learning_rate"),
                                       ("--batchsize", "batch_size")])
def test_unknown_key_suggests_closest(arg, close):
    with pytest.raises(UserError) as e:
        parse_config(TrainConfig, [arg])
    key = arg[2:].split("=")[0]
    assert key in str(e.value) and f"'{close}'" in str(e.value)


def test_unknown_key_in_file_names_line(tmp_path):
    path = write(tmp_path, "batch_size = 4\nn_heads = 2\n")
    with pytest.raises(UserError) as e:
        parse_config(TrainConfig, [path])
    assert "n_heads" in str(e.value) and "n_head" in str(e.value) and ":2" in str(e.value)


@pytest.mark.parametrize("arg,key", [("--batch_size=abc", "batch_size"), ("--max_iters=1.5", "max_iters"),
                                     ("--dropout=high", "dropout"), ("--compile=maybe", "compile"),
                                     ("--batch_size=True", "batch_size")])
def test_bad_value_names_key(arg, key):
    with pytest.raises(UserError) as e:
        parse_config(TrainConfig, [arg])
    assert key in str(e.value)


def test_a_nul_character_in_a_string_setting_is_one_line(tmp_path):
    """No path holds one: a path setting that did would fail deep in the file system's calls."""
    with pytest.raises(UserError, match=r"^command line: out_dir holds a NUL character \(\\x00\), got '/tmp/a\\x00b'$"):
        parse_config(TrainConfig, ["--out_dir='/tmp/a\\x00b'"])
    config = tmp_path / "nul.py"
    config.write_text("out_dir = 'a\\x00'\n")
    with pytest.raises(UserError, match=r":1: out_dir holds a NUL character"):
        parse_config(TrainConfig, [str(config)])


def test_missing_value():
    with pytest.raises(UserError, match="batch_size"):
        parse_config(TrainConfig, ["--batch_size"])


def test_positional_must_be_a_py_file():
    with pytest.raises(UserError, match="config file"):
        parse_config(TrainConfig, ["settings.txt"])
    with pytest.raises(UserError, match="not found"):
        parse_config(TrainConfig, ["no_such_config.py"])


@pytest.mark.parametrize("body", [
    "import os\nbatch_size = 4\n",
    "x = os.system('touch PWNED')\n",
    "n_layer = __import__('os').getpid()\n",
    "batch_size = open('PWNED', 'w').write('x')\n",
    "out_dir = f\"{__import__('os').system('touch PWNED')}\"\n",
    "n_layer = 1 if __import__('os').system('touch PWNED') else 2\n",
    "def f():\n    pass\n",
    "n_layer = n_head = 2\n",
    "n_layer: int = 2\n",
    "batch_size += 1\n",
    "batch_size = [1, 2\n",
])
def test_config_file_is_never_executed(tmp_path, monkeypatch, body):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, body)
    with pytest.raises(UserError) as e:
        parse_config(TrainConfig, [path])
    assert path in str(e.value)
    assert not (tmp_path / "PWNED").exists()


def test_config_file_literals(tmp_path):
    path = write(tmp_path, "learning_rate = 1e-3\nmax_iters = 2_000\nlr_decay_iters = 2e3\nbias = False\n"
                           "min_lr = 1e-4  # a comment\nn_embd = 64\nn_head = 4\n")
    cfg = parse_config(TrainConfig, [path])
    assert cfg.learning_rate == 1e-3 and cfg.max_iters == 2000
    assert cfg.lr_decay_iters == 2000 and isinstance(cfg.lr_decay_iters, int)
    assert cfg.model.bias is False and cfg.model.n_embd == 64


def test_config_file_type_error_names_key(tmp_path):
    path = write(tmp_path, "batch_size = 'big'\n")
    with pytest.raises(UserError, match="batch_size"):
        parse_config(TrainConfig, [path])


@pytest.mark.parametrize("argv,word", [
    (["--n_embd=30", "--n_head=4"], "n_embd"),
    (["--batch_size=0"], "batch_size"),
    (["--dropout=1.0"], "dropout"),
    (["--pos_emb=alibi"], "pos_emb"),
    (["--device=gpu"], "device"),
    (["--dtype=fp8"], "dtype"),
    (["--pos_emb=rope", "--n_embd=36", "--n_head=4"], "rope"),
    (["--learning_rate=-1"], "learning_rate"),
])
def test_validate_errors_are_user_errors(argv, word):
    with pytest.raises(UserError, match=word):
        parse_config(TrainConfig, argv)


def test_help_exits_zero_and_lists_keys(capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(TrainConfig, ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for key in ["--batch_size", "--n_layer", "--learning_rate", "--wandb_log", "--init_from"]:
        assert key in out
    assert "sequences per micro-batch" in out  # the field comments are the help text


def test_help_wins_over_bad_arguments(capsys):
    with pytest.raises(SystemExit) as e:
        parse_config(TrainConfig, ["--no_such_key=1", "-h"])
    assert e.value.code == 0


CONFIG_FILES = sorted((REPO / "config").glob("*.py"))


def test_there_are_config_files():
    assert CONFIG_FILES


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.name for p in CONFIG_FILES])
def test_shipped_config_files_load(path: Path):
    from gptkit.chat.reinforce import RLConfig

    kind = RLConfig if path.name == "chat_rl.py" else TrainConfig  # rl.py's; every other one is train.py's
    assert isinstance(parse_config(kind, [str(path)]), kind)


def test_every_model_setting_comes_from_the_model():
    """GPTConfig is the one source: each of its fields (but the vocabulary, which the dataset sets) is a
    train.py key with the model's type, default, allowed values and help, and lands in cfg.model."""
    keys = settings(TrainConfig)
    for f in fields(GPTConfig):
        if f.name == "vocab_size":
            assert f.name not in keys
            continue
        s = keys[f.name]
        assert s.owner == ("model",) and s.default == f.default and s.help, f.name
    assert keys["pos_emb"].choices == ("learned", "rope", "none") and keys["pos_emb"].type is str
    cfg = parse_config(TrainConfig, ["--rope_base=500", "--pos_emb=rope", "--norm=rmsnorm"])
    assert (cfg.model.rope_base, cfg.model.pos_emb, cfg.model.norm) == (500.0, "rope", "rmsnorm")
    with pytest.raises(UserError, match="unknown config key 'vocab_size'"):
        parse_config(TrainConfig, ["--vocab_size=100"])


@dataclass
class Window:
    """A learner's new options that may be None, as model.py's GPTConfig would have them."""
    window: int | None = None  # keys each query sees (None = all)
    scale: Optional[float] = 1.0  # a scale, or None for none
    kind: Literal["a", "b"] | None = None  # a choice, or None
    name: str | None = "x"  # a name, or None
    flag: Optional[bool] = None  # on, off, or None: undecided


def test_an_option_that_may_be_none_takes_its_type_or_none(tmp_path, capsys):
    """`X | None` and Optional[X]: an X, or None, from the command line and config files; anything else is one
    line naming the key; --help lists None among the choices."""
    path = write(tmp_path, "window = 16\nscale = None\nkind = 'b'\nname = None\n")
    assert parse_config(Window, [path]) == Window(window=16, scale=None, kind="b", name=None)
    assert parse_config(Window, ["--window=8", "--scale=2", "--kind=a", "--name=y", "--flag"]) == \
        Window(window=8, scale=2.0, kind="a", name="y", flag=True)
    assert parse_config(Window, [path, "--window=None", "--kind", "None", "--name='None'"]) == \
        Window(scale=None, name="None")
    for arg, message in (("--window=abc", "window must be int or None, got 'abc'"),
                         ("--window=1.5", "window must be int or None, got 1.5"),
                         ("--kind=c", "kind must be one of a, b (got 'c')")):
        with pytest.raises(UserError, match=rf"^command line: {re.escape(message)}$"):
            parse_config(Window, [arg])
    with pytest.raises(SystemExit):
        parse_config(Window, ["--help"])
    out = capsys.readouterr().out
    assert "--window=None" in out and "[a | b | None]" in out
    assert parse_config(TrainConfig, ["--out_dir=None"]).out_dir == "None"  # a string that may not be None keeps it


def test_a_value_that_may_be_none_comes_back_from_a_saved_config():
    """As a resume reads a checkpoint's saved config (asdict, then each value coerced as a config file's)."""
    known = settings(Window)
    for cfg in (Window(window=16, scale=None, flag=False), Window()):
        saved = {key: coerce(known[key], value, "saved", from_text=False)
                 for key, value in flatten(Window, asdict(cfg)).items()}
        assert resumed(Window, saved, {}, "ckpt.pt") == cfg
    assert resumed(Window, saved, {"window": 4}, "ckpt.pt").window == 4


@dataclass
class Unparsable:
    size: int | str = 0  # a size, or a word


@pytest.mark.parametrize("annotation,said", [
    (int | str, "int | str"), (Optional[int | float], "Union[int, float, None]"), (list, "list"),
    (Literal["a", 1], "Literal['a', 1]"),
])
def test_an_annotation_no_setting_can_take_is_one_line_naming_the_field(monkeypatch, annotation, said):
    monkeypatch.setitem(Unparsable.__annotations__, "size", annotation)
    with pytest.raises(UserError, match=rf"^test_settings.py: Unparsable.size is annotated {re.escape(said)}, "
                                        r"which no setting can take \(bool, int, float, str"):
        parse_config(Unparsable, ["--size=3"])


def test_help_lists_model_settings_with_their_choices(capsys):
    with pytest.raises(SystemExit):
        parse_config(TrainConfig, ["--help"])
    out = capsys.readouterr().out
    assert "model settings (model.py's GPTConfig):" in out
    assert "--rope_base=10000.0" in out and "rotary frequency base" in out
    assert "[learned | rope | none]" in out and "[adamw | muon]" in out


def test_the_page_s_span_of_the_model_settings_is_the_help_s(capsys):
    """docs/configuration.md names the model's settings from the first --help lists under their heading to the
    last."""
    with pytest.raises(SystemExit):
        parse_config(TrainConfig, ["--help"])
    listed = re.findall(r"^  --(\w+)=", capsys.readouterr().out.split("model settings (", 1)[1], re.M)
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert re.search(r"model's settings \(`(\w+)`, `\w+`, \.\.\., `(\w+)`\)", page).groups() == \
        (listed[0], listed[-1])


def test_a_preset_builds_on_its_base(tmp_path):
    """The base's settings first, the file's own over them, a command line over both; the base's path is
    relative to the file that names it, and a chain of bases works."""
    write(tmp_path, "batch_size = 4\nn_layer = 3\nout_dir = 'base'\n", "base.py")
    (tmp_path / "more").mkdir()
    write(tmp_path, "base = '../base.py'\nn_layer = 5\n", "more/middle.py")
    top = write(tmp_path, "base = 'more/middle.py'\nout_dir = 'top'\n", "top.py")
    cfg = parse_config(TrainConfig, [top, "--batch_size=6"])
    assert (cfg.batch_size, cfg.model.n_layer, cfg.out_dir) == (6, 5, "top")
    assert parse_config(TrainConfig, [top]).batch_size == 4


@pytest.mark.parametrize("body,others,message", [
    ("base = 'cfg.py'\n", {}, "leads back to"),
    ("base = 'b.py'\n", {"b.py": "base = 'cfg.py'\n"}, "leads back to"),
    ("batch_size = 4\nbase = 'b.py'\n", {"b.py": ""}, "base must come before the file's own settings"),
    ("base = 3\n", {}, "base must name a config file ending in .py"),
    ("base = 'missing.py'\n", {}, r"cfg.py:1: base 'missing.py' is not there \(.*missing.py not found; a base is a "
                                   r"path from the config file's own folder\)"),
    ("base = 'b.py'\n", {"b.py": "n_heads = 2\n"}, r"b.py:1: unknown config key 'n_heads'"),
])
def test_a_bad_base_is_one_clear_error(tmp_path, body, others, message):
    for name, text in others.items():
        write(tmp_path, text, name)
    with pytest.raises(UserError, match=message):
        parse_config(TrainConfig, [write(tmp_path, body)])


def test_a_key_set_twice_in_one_file_is_one_line_naming_both_lines(tmp_path):
    """A key repeated in one file is a slip (the earlier line would be ignored); set again by a later file, the
    command line or over a base's, it is how configs build on each other."""
    path = write(tmp_path, "n_layer = 1  # my change\nmax_iters = 2\nn_layer = 3\n")
    with pytest.raises(UserError) as e:
        parse_config(TrainConfig, [path])
    assert str(e.value) == f"{path}:3: n_layer is set again (first on line 1)"
    base = write(tmp_path, "n_layer = 1\n", "base.py")
    top = write(tmp_path, "base = 'base.py'\nn_layer = 2\n", "top.py")
    assert parse_config(TrainConfig, [base, top]).model.n_layer == 2
    assert parse_config(TrainConfig, [top, base, "--n_layer=3"]).model.n_layer == 3


def test_the_longer_presets_build_on_the_default():
    """The 5- and 10-minute presets name their base rather than repeat it: only what differs is written."""
    texts = {p.name: p.read_text(encoding="utf-8") for p in CONFIG_FILES}
    assert "base = 'shakespeare_char.py'" in texts["shakespeare_char_5min.py"]
    assert "base = 'shakespeare_char_5min.py'" in texts["shakespeare_char_10min.py"]
    ten = parse_config(TrainConfig, [str(REPO / "config/shakespeare_char_10min.py")])
    assert (ten.model.n_embd, ten.compile, ten.model.pos_emb, ten.max_time) == (192, True, "rope", 600)
    assert "base = 'shakespeare_char.py'" in texts["shakespeare_char_gpu_30s.py"]
    gpu = parse_config(TrainConfig, [str(REPO / "config/shakespeare_char_gpu_30s.py")])
    assert (gpu.model.n_layer, gpu.model.n_embd, gpu.model.block_size, gpu.batch_size) == (6, 384, 256, 64)
    assert (gpu.optimizer, gpu.model.token_shift, gpu.compile, gpu.min_tokens_per_param, gpu.max_time) == \
        ("muon", True, False, 0, 30)


# ---------------------------------------------------------------------------------------------- hostile input

@pytest.mark.slow
def test_config_file_is_parsed_never_executed(tmp_path):
    marker = tmp_path / "MARKER"
    config = tmp_path / "evil.py"
    config.write_text(f"batch_size = __import__('os').system('touch {marker}')\n", encoding="utf-8")
    proc = run_script("train.py", str(config), cwd=tmp_path)
    assert proc.returncode == 1
    assert assert_one_error_line(proc.stderr) == (f"error: {config}:1: batch_size must be a literal value "
                                                  "(config files are parsed, never executed)")
    assert not marker.exists()


DEEP = 100_000
DEEP_VALUES = {"parens": "(" * DEEP + "1" + ")" * DEEP, "list": "[" * DEEP + "]" * DEEP,
               "list_within_the_parser": "[" * 150 + "]" * 150, "minus": "-" * DEEP + "1",
               "not": "not " * DEEP + "1", "sum": "1" + "+1" * DEEP}


@pytest.mark.parametrize("value", DEEP_VALUES.values(), ids=DEEP_VALUES)
def test_a_config_file_nested_too_deeply_is_one_error_line(tmp_path, value):
    path = tmp_path / "deep.py"
    path.write_text(f"dpi = {value}\n")
    with pytest.raises(UserError) as e:
        plot.main(["loss", str(path)])
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value) and len(str(e.value)) < 400


@pytest.mark.parametrize("key", ["dpi", "output"])
@pytest.mark.parametrize("value", DEEP_VALUES.values(), ids=DEEP_VALUES)
def test_a_command_line_value_nested_too_deeply_is_one_error_line(tmp_path, key, value):
    with pytest.raises(UserError) as e:
        plot.main(["loss", f"--out_dir={tmp_path}", f"--{key}={value}"])
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


@pytest.mark.slow
def test_deep_nesting_through_the_command_itself(tmp_path):
    """As a user meets it: one line on stderr, from a file and from an argument (an argument is at most 128 KiB)."""
    path = tmp_path / "deep.py"
    path.write_text("dpi = " + "-" * DEEP + "1\n")
    for args in ([path], ["--dpi=" + "(" * 60_000 + "1" + ")" * 60_000]):
        proc = run_script("plot.py", "loss", f"--out_dir={tmp_path}", *args)
        assert proc.returncode == 1
        assert len(assert_one_error_line(proc.stderr)) < 400


def test_a_chain_of_presets_too_long_is_one_error_line(tmp_path):
    for i in range(2000):
        (tmp_path / f"c{i}.py").write_text(f"base = 'c{i + 1}.py'\n")
    (tmp_path / "c2000.py").write_text("batch_size = 3\n")
    with pytest.raises(UserError, match="too many bases in a row"):
        parse_config(TrainConfig, [str(tmp_path / "c0.py")])
    (tmp_path / "c50.py").write_text("batch_size = 3\n")  # a chain of 51 is fine
    assert parse_config(TrainConfig, [str(tmp_path / "c0.py")]).batch_size == 3


@dataclass
class Commented:
    plain: int = 1  # said after it
    # said above it,
    # on two lines
    above: int = 2
    spread: str = ("a,"
                   "b")  # said where its default ends
    # a heading of what follows, then a blank line

    bare: int = 3


def test_a_fields_help_is_its_comment_after_it_above_it_or_where_its_default_ends():
    helps = {name: s.help for name, s in settings(Commented).items()}
    assert helps == {"plain": "said after it", "above": "said above it, on two lines",
                     "spread": "said where its default ends", "bare": ""}


def script_configs():
    """Every config class a command parses: the scripts', the benchmarks' and those the package holds for them."""
    import importlib
    import pkgutil
    from dataclasses import is_dataclass

    import benchmarks
    from gptkit.chat.reinforce import RLConfig
    from gptkit.data.preparing import PrepareConfig
    from gptkit.lab.ladder import LabCommand
    found = [TrainConfig, RLConfig, PrepareConfig, LabCommand]
    for name in ["sample", "chat", "explore", "export", "analyze", "plot",
                 *(f"benchmarks.{m.name}" for m in pkgutil.iter_modules(benchmarks.__path__))]:
        module = importlib.import_module(name)
        found += [v for k, v in vars(module).items() if isinstance(v, type) and is_dataclass(v)
                  and v.__module__ == module.__name__ and k.endswith("Config")]
    return found


def test_every_key_of_every_command_has_a_meaning_in_its_help():
    """--help gives each key its field's comment: none is listed with a blank where its meaning goes."""
    blank = {f"{cls.__name__}.{name}" for cls in script_configs() for name, s in settings(cls).items() if not s.help}
    assert not blank


def test_every_command_refuses_a_thread_count_far_past_the_cores_in_one_line():
    """--threads=100000 crashed torch's thread pool (a segfault in sample.py, chat.py and train.py, no line)."""
    import os
    most = 4 * (os.cpu_count() or 1)
    takers = [cls for cls in script_configs() if "threads" in settings(cls)]
    assert {cls.__name__ for cls in takers} >= {"TrainConfig", "RLConfig", "LabCommand", "SampleConfig", "ChatConfig"}
    for cls in takers:
        with pytest.raises(UserError, match=rf"^threads must be at most {most}, four times this machine's "):
            parse_config(cls, ["--threads=100000"])
        parse_config(cls, [f"--threads={most}"])
