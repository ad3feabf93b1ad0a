"""Reading config files into one YAML tree: `extends` chains, `!replace`, dotted overrides, and where a key came from.

A config may start with `extends: <file>` (a path relative to the extending file): the base is read first (it may
extend another) and this file's keys go over it. Mappings merge key by key, so a file names only what it changes;
anything else (a list, a number, null) replaces the base's value. A mapping tagged `!replace` replaces the base's
mapping whole, for a table whose keys must go (`max_drop: !replace {format_valid: 0.02}` drops the base's others).
The schema (flywheel/config.py) validates the merged tree, and its errors name the file each key came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the key and where it came from."""


class _Replace(dict):
    """A mapping tagged `!replace`: it replaces the base's mapping instead of merging into it."""


class _Loader(yaml.SafeLoader):
    pass


def _construct_replace(loader: _Loader, node: yaml.Node) -> _Replace:
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(None, None, "!replace tags a mapping ({key: value, ...})",
                                                node.start_mark)
    return _Replace(loader.construct_mapping(node, deep=True))


_Loader.add_constructor("!replace", _construct_replace)


def read_tree(path: Path) -> tuple[dict, dict[str, str]]:
    """The merged tree of `path` and the files it extends, and for every dotted key the file that set it last."""
    return _read(path.resolve(), ())


def chain(path: Path) -> list[Path]:
    """`path` and the files it extends, the base last (resolved): what a job needs in its working directory."""
    files = [path.resolve()]
    while True:
        base = _parse(files[-1]).get("extends")
        if base is None:
            return files
        files.append(_base_path(files[-1], base, tuple(files[:-1])))


def _parse(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        tree = yaml.load(path.read_text(), Loader=_Loader) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(tree).__name__}")
    return tree


def _base_path(path: Path, base: Any, seen: tuple[Path, ...]) -> Path:
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: 'extends' must name one config file, got {base!r}")
    resolved = (path.parent / Path(base).expanduser()).resolve()
    if resolved == path or resolved in seen:
        cycle = " -> ".join(str(p) for p in (*seen, path, resolved))
        raise ConfigError(f"{path}: 'extends' makes a cycle: {cycle}")
    if not resolved.is_file():
        raise ConfigError(f"{path}: 'extends: {base}' names no file ({resolved})")
    return resolved


def _read(path: Path, seen: tuple[Path, ...]) -> tuple[dict, dict[str, str]]:
    tree = _parse(path)
    base = tree.pop("extends", None)
    if base is None:
        return _plain(tree), {key: str(path) for key in _dotted_keys(tree)}
    merged, origins = _read(_base_path(path, base, seen), (*seen, path))
    _merge(merged, tree, origins, str(path), "")
    return merged, origins


def _merge(base: dict, child: dict, origins: dict[str, str], source: str, prefix: str) -> None:
    for key, value in child.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and not isinstance(value, _Replace) and isinstance(base.get(key), dict):
            origins[dotted] = source
            _merge(base[key], value, origins, source, dotted + ".")
            continue
        for k in [k for k in origins if k.startswith(dotted + ".")]:  # the base's keys under it are gone
            del origins[k]
        base[key] = _plain(value)
        origins.update({k: source for k in _dotted_keys({key: value}, prefix)})


def _plain(node: Any) -> Any:
    """The tree without `!replace` marks (after merging they mean nothing, and pydantic wants plain dicts)."""
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _dotted_keys(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        keys.append(f"{prefix}{key}")
        if isinstance(value, dict):
            keys += _dotted_keys(value, f"{prefix}{key}.")
    return keys


def origin_of(key: str, origins: dict[str, str], default: str) -> str:
    """The file that set `key`, or the nearest section above it (a key the schema filled in has none)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = origins.get(".".join(parts[:n]))
        if found is not None:
            return found
    return default


def set_dotted(tree: dict, dotted: str, value: Any, source: str) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: cannot set '{dotted}': '{k}' is a value, not a section")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`train.lr=1e-5` -> ("train.lr", 1e-05). Values are read as YAML so lists and numbers work."""
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected key=value, e.g. judge.engine=vllm")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{text}': malformed key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{text}': value is not valid YAML ({e})") from None
    return key, value
