"""
Configs as data: fill any config dataclass from config files of plain assignments and
--key=value arguments. Config files are read with `ast` and never executed: only literal
values are accepted.

A field whose type is itself a config dataclass (TrainConfig.model, a GPTConfig) is flattened:
its settings are typed as --n_layer, not --model.n_layer, and each keeps the type, default,
allowed values (a Literal annotation) and help (the field's one-line comment) its own class gives
it. A field annotated `X | None` (or Optional[X]) takes None as well as an X: `--key=None`, or
`key = None` in a config file; an annotation the parser cannot take is one error line naming the
field. A config class checks its values in __post_init__ and raises ValueError with one line, which
the parser reports as the user's error.
"""

import ast
import difflib
import inspect
import math
import os
import re
import sys
import types
import typing
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path

from gptkit.base.errors import UserError

TRUE_WORDS = {"true", "yes", "on", "1"}
FALSE_WORDS = {"false", "no", "off", "0"}


@dataclass(frozen=True)
class Setting:
    """One key a user can set."""

    name: str
    type: type  # bool, int, float or str
    choices: tuple  # the allowed values, from a Literal annotation; () allows any value of the type
    default: object
    help: str
    owner: tuple  # the nested config fields it lives in: () for the top level, ("model",) for TrainConfig.model
    optional: bool = False  # None is a value too (an annotation `X | None` or Optional[X])


def settings(cls, owner=()):
    """{key: Setting} for every key of cls, nested config dataclasses flattened into it.
    A nesting field can leave keys out (metadata {"not_settable": (...)}) that the program sets itself, and a field
    the constructor does not take (init=False) is none."""
    hints, comments, out = typing.get_type_hints(cls), field_comments(cls), {}
    for f in fields(cls):
        if not f.init:  # the program sets it, after the settings built the rest
            continue
        hint = hints[f.name]
        if is_dataclass(hint):
            nested = settings(hint, owner + (f.name,))
            for name in f.metadata.get("not_settable", ()):
                del nested[name]
            if clash := sorted(nested.keys() & out.keys() | nested.keys() & {g.name for g in fields(cls)}):
                # a field the learner added to model.py's GPTConfig, named as a training setting is
                raise UserError(f"{Path(inspect.getsourcefile(hint)).name}: {hint.__name__}.{clash[0]} has the name "
                                f"of another setting of {cls.__name__} ({Path(inspect.getsourcefile(cls)).name}): "
                                "the command line and config files name each setting once; give it another name")
            out.update(nested)
            continue
        typed = field_type(hint)
        if typed is None:
            raise UserError(f"{Path(inspect.getsourcefile(cls)).name}: {cls.__name__}.{f.name} is annotated "
                            f"{annotation(hint)}, which no setting can take (bool, int, float, str or a Literal of "
                            "them, each alone or with | None)")
        default = f.default if f.default is not MISSING else None
        out[f.name] = Setting(f.name, typed[0], typed[1], default, comments.get(f.name, ""), owner, typed[2])
    return out


PLAIN_TYPES = (bool, int, float, str)


def field_type(hint):
    """(type, choices, optional) of a field's annotation: one of PLAIN_TYPES, or a Literal of values of one of them
    (its choices), either alone or with None (`X | None`, Optional[X]: optional); None for any other annotation."""
    args = typing.get_args(hint)
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        others = [a for a in args if a is not type(None)]
        if len(others) > 1:
            return None
        hint = others[0]
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        kinds = {type(c) for c in choices}
        return (kinds.pop(), choices, optional) if len(kinds) == 1 and kinds <= set(PLAIN_TYPES) else None
    return (hint, (), optional) if hint in PLAIN_TYPES else None


def annotation(hint):
    """A type annotation as it is written: int | None, Optional[int], Literal['a', 'b']."""
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "").replace("NoneType", "None")


def field_comments(cls):
    """The comment of each field in the class source, used as --help text: the one after it on its line (or on the
    line that ends a default written over several), else the comment lines just above it, joined; a subclass's
    fields and those it inherits from config dataclasses alike."""
    comments = {}
    for klass in reversed([k for k in cls.__mro__ if is_dataclass(k)]):
        above, open_field = [], None  # the comment lines just read; a field whose default goes on to later lines
        for line in inspect.getsource(klass).splitlines():
            field = re.match(r"\s+(\w+): [^=]+ = ", line)
            trailing = re.search(r"  # (.*)$", line)
            if field:
                name, open_field = field.group(1), None
                if trailing:
                    comments[name] = trailing.group(1)
                elif above:
                    comments[name] = " ".join(above)
                else:
                    open_field = name
                above = []
            elif re.match(r"\s+# ", line):
                above.append(line.strip()[2:])
            else:
                continued = line.startswith((" " * 8, "\t"))  # a default written over several lines goes on
                if open_field and continued and trailing:
                    comments[open_field], open_field = trailing.group(1), None
                elif not continued:
                    open_field = None
                above = []
    return comments


def build(cls, values):
    """cls(...) from flat {key: value}, nested configs built from the keys that are theirs."""
    hints, kwargs = typing.get_type_hints(cls), {}
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            kwargs[f.name] = build(hints[f.name], values)
        elif f.name in values:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def flatten(cls, saved):
    """The flat {key: value} of a config saved as a (nested) dict, e.g. by dataclasses.asdict; keys cls
    no longer has are left out."""
    hints, values = typing.get_type_hints(cls), {}
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            values.update(flatten(hints[f.name], saved.get(f.name) or {}))
        elif f.name in saved:
            values[f.name] = saved[f.name]
    return values


def make(cls, values):
    """build(cls, values), its checks (ValueError from __post_init__) reported as the user's error."""
    try:
        return build(cls, values)
    except ValueError as e:
        raise UserError(str(e)) from None


def comma_items(text):
    """The items of a comma-separated option, stripped, empty ones left out."""
    return [item.strip() for item in text.split(",") if item.strip()]


def require(cfg, names, allowed, meaning):
    """A config's range check: raise ValueError (one line) for the first of names whose value is not allowed."""
    for name in names:
        value = getattr(cfg, name)
        if not allowed(value):
            raise ValueError(f"{name} must be {meaning} (got {value!r})")


def check_seed(seed):
    """Every command's seed range: numpy takes seeds below 2**32, torch's generators any 64-bit number."""
    if not 0 <= seed < 2 ** 31:
        raise ValueError(f"seed must be in [0, 2**31) (got {seed!r})")


def check_threads(threads):
    """Every command's CPU thread count: thousands crash torch's thread pool (a segfault, with no line), and more
    threads than cores only wait on each other."""
    cores = os.cpu_count() or 1
    if threads > 4 * cores:
        raise ValueError(f"threads must be at most {4 * cores}, four times this machine's {cores} cores (got "
                         f"{threads!r}); 0 picks the count")


def closest(word, choices):
    """"; did you mean 'X'?" for the choice closest to a mistyped word, or ""."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.7)
    return f"; did you mean '{close[0]}'?" if close else ""


def unknown_key_error(key, known, source):
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return UserError(f"{source}: unknown config key '{key}'{hint}")


def coerce(setting, value, source, from_text):
    """Convert a parsed value to the setting's type, or raise one clear error naming the key."""
    key, typ = setting.name, setting.type
    if from_text:  # command-line text: a Python literal if it parses, else the bare word
        try:
            literal = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            literal = value
        if typ is not str or isinstance(literal, str) or literal is None and setting.optional:
            value = literal  # else a string setting keeps the text as typed (123, True)
    if value is None and setting.optional:
        return None
    converted = to_type(value, typ)
    if converted is None:
        raise UserError(f"{source}: {key} must be {typ.__name__}{' or None' * setting.optional}, got {shown(value)}")
    if typ is float and not math.isfinite(converted):
        raise UserError(f"{source}: {key} must be a finite number, got {shown(value)}")
    if typ is int and not -2 ** 63 <= converted < 2 ** 63:
        raise UserError(f"{source}: {key} is out of range ({shown(converted)} does not fit in 64 bits)")
    if typ is str and "\0" in converted:  # no path can hold one, and no tokenizer has it as text
        raise UserError(f"{source}: {key} holds a NUL character (\\x00), got {shown(converted)}")
    if setting.choices and converted not in setting.choices:
        raise UserError(f"{source}: {key} must be one of {', '.join(map(str, setting.choices))} "
                        f"(got {shown(converted)}{closest(converted, setting.choices)})")
    return converted


def shown(value, limit=80):
    """repr(value) for a one-line message, its middle cut out where it is long (a pasted file, a value
    nested hundreds deep)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 2:]}"


def to_type(value, typ):
    """value as typ (bool, int, float or str), or None where it is not one."""
    if typ is bool:
        if isinstance(value, bool):
            return value
        word = str(value).lower()
        return word in TRUE_WORDS if word in TRUE_WORDS | FALSE_WORDS else None
    if isinstance(value, bool):
        return None
    if typ is int:
        if isinstance(value, int):
            return value
        return int(value) if isinstance(value, float) and value.is_integer() else None
    if typ is float:
        return float(value) if isinstance(value, (int, float)) else None
    return value if isinstance(value, str) else None


def read_config_file(path, known, including=()):
    """The assignments in a config file, as {key: value}; anything but literals is refused. A file may begin
    with `base = 'other.py'` (a path relative to the file): the other file's settings, which this one's override.
    A key set twice in the file is refused: the first line would be ignored without a word."""
    tree = parse_config_file(path)
    values, first_lines = {}, {}
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if not isinstance(target, ast.Name):
            raise UserError(f"{path}:{node.lineno}: only `name = value` assignments are allowed in config files")
        key, where = target.id, f"{path}:{node.lineno}"
        if key != BASE_KEY and key not in known:
            raise unknown_key_error(key, known, where)
        if key in first_lines:
            raise UserError(f"{where}: {key} is set again (first on line {first_lines[key]})")
        first_lines[key] = node.lineno
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise UserError(f"{where}: {key} must be a literal value (config files are parsed, never executed)") \
                from None
        if key == BASE_KEY:
            values = {**read_base(path, value, known, including, where, first=not values), **values}
        else:
            values[key] = coerce(known[key], value, where, from_text=False)
    return values


BASE_KEY = "base"  # in a config file: the preset it builds on
MAX_BASES = 100  # presets in one chain of bases: more than any real one, and each costs stack frames


def read_base(path, base, known, including, where, first):
    """The settings of the preset a config file names as its base, which must come before its own."""
    if not isinstance(base, str) or not base.endswith(".py"):
        raise UserError(f"{where}: base must name a config file ending in .py (got {base!r})")
    if not first:
        raise UserError(f"{where}: base must come before the file's own settings")
    base_path = Path(path).parent / base
    chain = (*including, Path(path).resolve())
    if base_path.resolve() in chain:
        raise UserError(f"{where}: base {base!r} leads back to {base_path} (a preset cannot build on itself)")
    if len(chain) >= MAX_BASES:
        raise UserError(f"{where}: too many bases in a row (more than {MAX_BASES} presets each building on the next)")
    if not base_path.exists():  # the line that names it is where to look
        raise UserError(f"{where}: base {base!r} is not there ({base_path} not found; a base is a path from the "
                        "config file's own folder)")
    return read_config_file(str(base_path), known, chain)


def parse_config_file(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"config file {path} is a folder, not a file") from None
    except OSError as e:
        raise UserError(f"could not read config file {path} ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not a valid config file ({e})") from None
    try:
        return ast.parse(text, filename=path)
    except (SyntaxError, ValueError) as e:
        raise UserError(f"{path}: not a valid config file ({e})") from None
    except (RecursionError, MemoryError):  # the parser's own limits, met by an expression nested thousands deep
        raise UserError(f"{path}: not a valid config file (nested too deeply to parse)") from None


def split_args(argv, known):
    """Yield (key, text) pairs and (None, config file path) from argv, accepting --k=v, --k v and --flag."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--"):
            yield None, arg
            continue
        key, eq, text = arg[2:].partition("=")
        if key not in known:
            raise unknown_key_error(key, known, "command line")
        if not eq:
            is_bool = known[key].type is bool
            if i < len(argv) and not argv[i].startswith("--") and not (is_bool and argv[i].endswith(".py")):
                text = argv[i]
                i += 1
            elif is_bool:
                text = "True"
            else:
                raise UserError(f"command line: --{key} needs a value, e.g. --{key}=VALUE")
        yield key, text


MODEL_HEADING = "model settings (model.py's GPTConfig):"


def print_help(cls, prog):
    print(f"usage: python {prog} [config_file.py ...] [--key=value ...]")
    groups, nesting = {}, {f.name: f for f in fields(cls)}
    for s in settings(cls).values():
        groups.setdefault(s.owner, []).append(s)
    for owner, group in groups.items():  # a nesting field may say how its settings apply (metadata "heading")
        print(f"\n{nesting[owner[0]].metadata.get('heading', MODEL_HEADING)}" if owner else "")
        for s in group:
            choices = f" [{' | '.join(map(str, s.choices + (None,) * s.optional))}]" if s.choices else ""
            print(f"  {f'--{s.name}={s.default!r}':<32} {s.help}{choices}")


def pick_subcommand(prog, commands, argv, noun):
    """(name, remaining argv) for `python PROG NAME [--key=value ...]`; None after printing usage."""
    names = ", ".join(commands)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python {prog} {{{names}}} [--key=value ...]   (python {prog} NAME --help for options)")
        return None
    if argv[0] not in commands:
        raise UserError(f"unknown {noun} {argv[0]!r}; choose one of: {names}")
    return argv[0], argv[1:]


def given_values(cls, argv, prog=None):
    """The {key: value} that config files and --key=value arguments set (later ones win), typed and
    nothing else: what a user asked for, as apart from the defaults."""
    prog = prog or Path(sys.argv[0]).name
    if any(a in ("-h", "--help") for a in argv):
        print_help(cls, prog)
        sys.exit(0)
    known = settings(cls)
    values = {}
    for key, text in split_args(argv, known):
        if key is None:
            if not text.endswith(".py"):
                raise UserError(f"command line: expected a config file ending in .py or --key=value, got {text!r}")
            values.update(read_config_file(text, known))
        else:
            values[key] = coerce(known[key], text, "command line", from_text=True)
    return values


def config_file_values(cls, argv):
    """The {key: value} argv's config files set, as apart from its --key=value arguments."""
    known = settings(cls)
    values = {}
    for key, text in split_args(argv, known):
        if key is None:
            values.update(read_config_file(text, known))
    return values


def command_line_keys(cls, argv):
    """The keys argv gives as --key=value, apart from those its config files set."""
    return {key for key, _ in split_args(argv, settings(cls)) if key is not None}


def resumed(cls, saved, given, path):
    """cls built as a continued run continues: the settings saved in the checkpoint at path, overridden by those
    given again; a saved value the checks refuse is said to be the saved one."""
    try:
        return make(cls, {**saved, **given})
    except UserError as e:  # the given settings passed alone: a saved one is out of range, or goes with them badly
        raise UserError(f"{e}, with the settings saved in {path} (give one again to replace its saved value)") \
            from None


def parse_config(cls, argv, prog=None):
    """Build cls from config files and --key=value arguments (later ones win); its checks become UserErrors."""
    return make(cls, given_values(cls, argv, prog))
