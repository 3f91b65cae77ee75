"""Errors of the command line as one `error:` line: jsonargparse's parse errors, our own, replaced configs.

jsonargparse reports a bad value as several lines (every subclass it tried, then the value); users get the
config file, the key, why and the value. This module is the one place that reads jsonargparse's error text.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from leanagent.errors import DISK_ERRNOS, LeanAgentError, write_failed
from leanagent.io import broken_link

# Configs that overlays replaced: what to give instead (shown when the old path no longer exists).
REPLACED_CONFIGS = {
    "retrieval_mathlib.yaml": "--config configs/retrieval.yaml --config configs/recipes/mathlib.yaml",
    "retrieval_byt5_small.yaml": "--config configs/retrieval.yaml --config configs/recipes/byt5_small.yaml",
    "lifelong_mathlib.yaml": "--config configs/lifelong.yaml --config configs/recipes/lifelong_mathlib.yaml",
}


def config_paths(argv: list[str]) -> list[str]:
    """The files given with --config/-c (both `--config F` and `--config=F`)."""
    paths = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")]
    return paths + [a.split("=", 1)[1] for a in argv if a.startswith(("--config=", "-c="))]


def check_config_files(argv: list[str], label: str = "--config") -> None:
    """Configs that overlays replaced, and configs that are not UTF-8 text (jsonargparse raises a bare
    UnicodeDecodeError for those, naming no file), as one line before anything is parsed. `label` says where
    the files were given ("base:" for an ablation's base configs)."""
    check_section_flags(argv)
    for path in config_paths(argv):
        replacement = REPLACED_CONFIGS.get(Path(path).name)
        if replacement and not Path(path).exists():
            raise LeanAgentError(f"{label} {path}: this config was replaced by overlays; give {replacement}")
        if not Path(path).is_file():
            continue  # a missing file or a folder: jsonargparse says which (a pipe is left to it, unread)
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except OSError:
            continue
        except UnicodeDecodeError as e:
            raise LeanAgentError(f"{label} {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        tree = yaml_tree(text)  # composed once for the three checks; None: the parser says why
        if tree is None:
            continue
        if expanded_values(tree) > MAX_EXPANDED_VALUES:
            raise LeanAgentError(f"{label} {path}: its aliases (*name) expand to more than {MAX_EXPANDED_VALUES:,} values (or refer to "
                                 "themselves), which the parser would expand for hours: write the settings out, or use fewer nested aliases")
        check_sections(construct(tree, f"{label} {path}"), f"{label} {path}")
        twice = duplicate_key(tree)
        if twice:
            key, line, first = twice
            raise LeanAgentError(f"{label} {path}:{line}: '{key}' is given twice in one mapping (first on line {first}); "
                                 "YAML would keep the last and drop the other without a word: keep one")


# Top-level sections that hold settings by name. jsonargparse takes `trainer: null` or `trainer: [1]` and
# silently falls back to defaults (a fit without the config's callbacks, a lifelong run with other repositories),
# or fails deep inside instantiation; `model`, `optimizer` and `lr_scheduler` also take a class name.
SECTIONS = ("trainer", "data", "progressive", "watchdog", "preemption", "repositories", "ewc")


def construct(tree: Any, where: str, lines: bool = True) -> Any:
    """The values of a `yaml_tree`, or None where the parser will say why. PyYAML fails on an explicitly tagged
    scalar it cannot read (`!!float x`, `!!timestamp x`) with a bare ValueError or AttributeError that names no
    file or line: that becomes one error naming both; `where` names the file (`lines`) or the flag."""
    import yaml

    try:
        return _construct(tree)
    except yaml.YAMLError:
        return None
    except Exception as e:  # noqa: BLE001 - PyYAML's constructors raise whatever int(), float() or re raise
        stack, seen = [tree], set()
        while stack:  # the first scalar that fails on its own, in the file's order
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.ScalarNode):
                try:
                    _construct(node)
                except Exception:  # noqa: BLE001
                    kind = node.tag.rsplit(":", 1)[-1]
                    at = f"{where}:{node.start_mark.line + 1}" if lines else where
                    raise LeanAgentError(f"{at}: {node.value!r} is not a valid {kind}, "
                                         f"which its tag !!{kind} asks for: fix the value or drop the tag") from None
            else:
                children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else node.value
                stack.extend(reversed(children))
        raise LeanAgentError(f"{where}: cannot be read as YAML ({type(e).__name__}: {e})") from None


def _construct(node: Any) -> Any:
    import yaml

    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def check_sections(root: Any, where: str) -> None:
    """Each of SECTIONS that a config file (`construct`ed) gives must be a mapping of settings; `where` names it."""
    if not isinstance(root, dict):
        return
    for key in SECTIONS:
        if key in root and not isinstance(root[key], dict):
            raise LeanAgentError(f"{where}: '{key}' must be a mapping of settings ({key}: {{...}} or an indented "
                                 f"block), got {_kind(root[key])}; leave it out for the defaults")


def flag_values(argv: list[str]) -> list[tuple[str, str]]:
    """(`--name`, value) for each `--name=value` and `--name value` of a command line."""
    found = []
    for i, arg in enumerate(argv):
        name, eq, given = arg.partition("=")
        if not name.startswith("--"):
            continue
        if eq:
            found.append((name, given))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            found.append((name, argv[i + 1]))
    return found


def check_section_flags(argv: list[str]) -> None:
    """`--trainer=null` or `--progressive 3` on the command line: jsonargparse blamed the config file, as
    "configs/retrieval.yaml: progressive.progressive: Unable to load config". A mapping (`--trainer '{...}'`) or
    a file of settings (`--trainer overlay.yaml`) is what such a flag takes. A tagged value PyYAML cannot read
    (`--trainer.max_epochs='!!int 0x'`) is refused here too: the parser raised it as a bare ValueError."""
    for name, given in flag_values(argv):
        section = name[2:] in SECTIONS
        if not (section or "!!" in given) or Path(given).is_file():
            continue
        tree = yaml_tree(given)  # None: empty, or not YAML
        value = construct(tree, f"{name}={given}", lines=False) if tree is not None else None
        read = not given.strip() or tree is not None and (value is not None or tree.tag == "tag:yaml.org,2002:null")
        if section and read and not isinstance(value, dict):  # what is not YAML, the parser says why
            raise LeanAgentError(f"{name}={given}: '{name[2:]}' must be a mapping of settings ({name} '{{key: value}}', "
                                 f"a YAML file of them, or {name}.KEY=VALUE), got {_kind(value)}")


def _kind(value: object) -> str:
    """What a section holds in place of a mapping, as both errors above say it."""
    return "null" if value is None else "a list" if isinstance(value, list) else f"{type(value).__name__} {value!r}"


MAX_EXPANDED_VALUES = 1_000_000  # far above any real config; an alias bomb's expansion is exponential


def yaml_tree(text: str) -> Any:
    """The YAML's node graph, aliases not expanded (an alias is the node it names), or None when the text is
    not YAML or is empty."""
    import yaml

    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None


def expanded_values(tree: Any) -> float:
    """How many values a `yaml_tree` (or YAML text) holds once every alias is expanded, as jsonargparse expands
    them, counted without expanding; 0 when there is nothing."""
    import yaml

    root = yaml_tree(tree) if isinstance(tree, str) else tree
    sizes: dict[int, float] = {}

    def size(node: yaml.Node) -> float:
        if id(node) not in sizes:
            sizes[id(node)] = math.inf  # until counted: an alias inside its own anchor expands without end
            children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else (
                node.value if isinstance(node, yaml.SequenceNode) else [])
            sizes[id(node)] = 1 + sum(size(child) for child in children)
        return sizes[id(node)]

    try:
        return size(root) if root is not None else 0
    except RecursionError:  # nested deeper than Python recurses: no config is
        return math.inf


def duplicate_key(tree: Any) -> tuple[str, int, int] | None:
    """(key, line, line of its first occurrence) of the first key a mapping of a `yaml_tree` (or YAML text)
    holds twice; None when there is none."""
    import yaml

    root = yaml_tree(tree) if isinstance(tree, str) else tree
    stack = [root] if root is not None else []
    seen_nodes: set[int] = set()  # an alias is the node it names: walked once, not once per alias
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in seen:
                        return key.value, key.start_mark.line + 1, seen[key.value]
                    seen[key.value] = key.start_mark.line + 1
            stack.extend(value for _, value in reversed(node.value))  # popped in the file's order
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed(node.value))
    return None


def summarize_parse_error(message: str, argv: list[str]) -> str:
    """jsonargparse's many-line parse errors as one line: config file(s), the innermost key, why, the value."""
    import yaml

    configs = config_paths(argv)
    if message.startswith("Problems parsing config"):
        for path in configs:
            try:
                yaml.safe_load(Path(path).read_text(encoding="utf-8"))
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f"{path}:{mark.line + 1}" if mark is not None else path
                return f"{where}: malformed YAML ({getattr(e, 'problem', None) or 'cannot parse'})"
            except (OSError, UnicodeDecodeError) as e:
                return f"{path}: cannot read the config ({e})"
    missing = re.match(r'Parser key "config": (.+)', message)
    if missing:  # a --config that names no file: "File does not exist: 'x.yaml'", "Path is not a file: 'dir'"
        named = re.search(r"'(.+)'", missing.group(1))
        link = broken_link(named.group(1)) if named else None
        return f"--config: {named.group(1)} {link}" if named and link else f"--config: {missing.group(1).strip()}"
    if message.startswith("Unexpected config"):  # a file that parses to no mapping of settings
        for path in configs:
            try:
                loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue
            if not isinstance(loaded, dict):
                what = "empty" if loaded is None else f"a {type(loaded).__name__}"
                return f"{path}: a config is a mapping of settings (key: value lines); this one is {what}"
    keys = re.findall(r'Parser key "([^"]+)"', message)
    values = re.findall(r"Given value: (.+)$", message, re.M)
    # A value from the command line (`--model.init_args.lr=nan` reaches jsonargparse as NestedArg(key='lr', ...)):
    # the error is that argument's, not the config files'.
    nested = re.search(r"NestedArg\(key='([^']+)'", message)
    dotted = ".".join(k for k in keys if "." not in k) if len(keys) > 1 else ".".join(keys)
    flags = [a for a in argv if a.startswith("--") and (
        (nested and a.split("=", 1)[0].endswith("." + nested.group(1))) or a.split("=", 1)[0] == f"--{dotted}")]
    flag = _blamed_flag(flags, {v.strip() for v in values + re.findall(r"Got value: (.+)$", message, re.M)})
    source = f"{flag}: " if flag else f"{', '.join(configs)}: " if configs else ""
    if keys:
        reason = _innermost_reason(message) or "invalid value"
        value = f" (got {values[0].strip()})" if values and not flag and "Got value" not in reason else ""
        key = f"{keys[0]}.{nested.group(1)}" if nested and len(keys) == 1 else ".".join(keys)
        return f"{source}{key}: {reason}{value}"
    return source + " ".join(line.strip() for line in message.splitlines() if line.strip())[:400]


def _blamed_flag(flags: list[str], quoted: set[str]) -> str | None:
    """Of the arguments that set the failing key (a key may be given twice), the one whose value the message
    quotes (jsonargparse quotes null as None), else the last, the one that counts."""
    def value(flag: str) -> str:
        given = flag.split("=", 1)[1] if "=" in flag else ""
        return "None" if given in ("null", "~") else given

    return next((f for f in reversed(flags) if value(f) and value(f) in quoted), flags[-1] if flags else None)


_STRUCTURE = ("Parser key", "Does not validate", "Subtypes:", "Errors:", "Given value", "- Problem with given class_path",
              "- Expected a <class 'NoneType'>", "Problem with")


def _innermost_reason(message: str) -> str | None:
    """The deepest line that says what is wrong ("Option 'x' is not accepted", "Expected a float. Got value: nan")."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    reasons = [line.lstrip("- ") for line in lines if not any(line.startswith(s) for s in _STRUCTURE) and "NoneType" not in line]
    return reasons[-1] if reasons else None


def user_error(error: BaseException | None) -> LeanAgentError | None:
    """jsonargparse wraps exceptions raised while instantiating classes; find ours in the chain."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, LeanAgentError):
            return error
        if isinstance(error, OSError) and error.errno in DISK_ERRNOS:  # a full disk anywhere: logs, outputs, /tmp
            return write_failed(error)
        if isinstance(error, PermissionError) and error.filename:  # a file or folder of the user's, not a bug of ours
            return LeanAgentError(f"{error.filename}: {error.strerror or 'permission denied'} (check its owner and mode)")
        if isinstance(error, ValueError) and str(error).strip().startswith("`val_check_interval` ("):
            # Lightning's, raised once the fit knows its batch count: a setting, not a bug
            return LeanAgentError(f"trainer.{str(error).strip().replace('`', '').split('. If you want')[0]} of an epoch "
                                  "(or set trainer.check_val_every_n_epoch=null to count batches across epochs)")
        if type(error).__name__ == "MisconfigurationException":  # Lightning's word for a setting it refuses once running
            return LeanAgentError(f"Lightning refused a setting: {' '.join(str(error).split())}")
        if isinstance(error, ModuleNotFoundError) and not (error.name or "").startswith("leanagent"):
            # A package missing from this environment, such as Lightning's optional ones (a config naming WandbLogger
            # without wandb: "Requirement 'wandb>=...' not met. HINT: ..."); a module of our own missing is a bug.
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            return LeanAgentError(f"a package the config needs is not installed: {first}")
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
