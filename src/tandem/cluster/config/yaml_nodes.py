"""YAML read as nodes, so every error can name the file, the line and the field.

`compose_file(path)` parses a file into a `Located` tree without constructing Python objects
first; each `Located` knows its node (with PyYAML's line marks) and its field path
("workers[2].role"). Reading a value applies a `rules.Rule`; a broken rule, an unknown key (with a
did-you-mean), a missing key or a duplicate key raises `TandemError("FILE:LINE: PATH: message")`.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor

from tandem.cluster.config.rules import Rule, RuleError, did_you_mean
from tandem.errors import TandemError


def compose_file(path: str | Path) -> "Located":
    """The file's root node; TandemError for unreadable files and YAML syntax errors."""
    try:
        source = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise TandemError(f"cannot read cluster file {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise TandemError(f"cannot read cluster file {path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    try:
        root = yaml.compose(source, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        line = f":{mark.line + 1}" if mark else ""
        raise TandemError(f"{path}{line}: not valid YAML: {error.problem}") from None
    except yaml.reader.ReaderError as error:  # a character YAML does not allow
        line = source.count("\n", 0, error.position) + 1
        raise TandemError(f"{path}:{line}: not valid YAML: character #x{error.character:04x} is not allowed") from None
    if root is None:
        raise TandemError(f"{path}:1: the file is empty")
    return Located(root, "", str(path))


@dataclass(frozen=True, slots=True)
class Located:
    node: yaml.Node
    path: str  # field path from the root: "workers[2].role"; "" for the root
    file: str

    @property
    def line(self) -> int:
        return self.node.start_mark.line + 1

    def error(self, message: str) -> TandemError:
        where = f"{self.path}: " if self.path else ""
        return TandemError(f"{self.file}:{self.line}: {where}{message}")

    def child_error(self, key: str, message: str) -> TandemError:
        """An error about a key this mapping lacks, at the mapping's line."""
        return TandemError(f"{self.file}:{self.line}: {self._child_path(key)}: {message}")

    def mapping(self, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, "Located"]:
        """The children of a mapping node by key; unknown, duplicate and missing keys are errors."""
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error(f"must be a mapping (got {_kind(self.node)})")
        children: dict[str, Located] = {}
        for key_node, value_node in self.node.value:
            key = Located(key_node, self.path, self.file)
            _refuse_merge_key(key)
            name = key.value()
            if not isinstance(name, str):
                raise key.error(f"keys must be strings (got {name!r})")
            if name in children:
                raise key.error(f"duplicate key {name!r}")
            if name not in allowed:
                raise key.error(f"unknown key {name!r}{did_you_mean(name, allowed)}; "
                                f"known keys: {', '.join(allowed)}")
            children[name] = Located(value_node, self._child_path(name), self.file)
        for name in required:
            if name not in children:
                raise self.error(f"missing required key {name!r}")
        return children

    def free_mapping(self) -> dict[str, "Located"]:
        """A mapping whose keys are data (resource names, group pairs), checked by the caller."""
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error(f"must be a mapping (got {_kind(self.node)})")
        children: dict[str, Located] = {}
        for key_node, value_node in self.node.value:
            _refuse_merge_key(Located(key_node, self.path, self.file))
            name = Located(key_node, self.path, self.file).value()
            if str(name) in children:
                raise Located(key_node, self.path, self.file).error(f"duplicate key {name!r}")
            children[str(name)] = Located(value_node, self._child_path(str(name)), self.file)
        return children

    def sequence(self) -> list["Located"]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error(f"must be a list (got {_kind(self.node)})")
        return [Located(item, f"{self.path}[{i}]", self.file) for i, item in enumerate(self.node.value)]

    def value(self) -> Any:
        """The node as plain Python data (scalars, lists, dicts)."""
        try:
            return SafeConstructor().construct_object(self.node, deep=True)
        except yaml.constructor.ConstructorError as error:  # a tag plain YAML data does not have
            raise self.error(f"cannot read this value: {error.problem}") from None

    def read(self, rule: Rule) -> Any:
        """The node's value checked by `rule`; a broken rule becomes a located error."""
        try:
            return rule(self.value())
        except RuleError as error:
            raise self.error(str(error)) from None

    def _child_path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key


MERGE_TAG = "tag:yaml.org,2002:merge"


def _refuse_merge_key(key: Located) -> None:
    if key.node.tag == MERGE_TAG:
        raise key.error("YAML merge keys (<<: *anchor) are not supported: write each worker's fields out")


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(SafeConstructor().construct_object(node, deep=True))
