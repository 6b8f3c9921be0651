"""YAML from files a user hands us (presets, `--set` values, accelerate_config.yaml), read with limits.

Why: yaml.safe_load runs no code, but a "billion laughs" document (anchors of lists of aliases of lists …) is a
few hundred bytes that expand to billions of nodes the moment anything walks the result: pydantic validating it,
or an error message printing it (a 312 MB line). Here a document is refused in one line when it is too large,
uses too many aliases, nests too deep, or expands (aliases followed) to too many nodes.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_YAML_BYTES = 1 << 20           # a preset or accelerate config is a few KiB
MAX_ALIASES = 64                   # a hand-written preset needs none
MAX_EXPANDED_NODES = 100_000       # every node counted once per path that reaches it
MAX_DEPTH = 64


class YamlLimitError(ValueError):
    """The document is valid YAML but past a limit (the message says which)."""


class _LimitedLoader(yaml.SafeLoader):
    def __init__(self, stream: Any):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:      # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlLimitError(f"more than {MAX_ALIASES} aliases (*name)")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlLimitError(f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(node: Any, memo: dict[int, int], limit: int) -> int:
    """Nodes in the document with every alias followed (shared subtrees counted once per use), capped at limit+1."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = limit + 1                  # a cycle (a recursive alias) counts as too large
    n = 1
    if isinstance(node, dict):
        items = list(node.keys()) + list(node.values())
    elif isinstance(node, list):
        items = node
    else:
        items = []
    for child in items:
        n += _expanded_size(child, memo, limit)
        if n > limit:
            break
    memo[key] = min(n, limit + 1)
    return memo[key]


def load_yaml(text: str) -> Any:
    """yaml.safe_load with limits; raises yaml.YAMLError for bad YAML and YamlLimitError past a limit."""
    if len(text) > MAX_YAML_BYTES:
        raise YamlLimitError(f"{len(text):,} characters, more than the {MAX_YAML_BYTES >> 10} KiB a YAML file here "
                             "may have")
    loader = _LimitedLoader(text)
    try:
        data = loader.get_single_data()
    except RecursionError:
        raise YamlLimitError(f"nested deeper than {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()
    if _expanded_size(data, {}, MAX_EXPANDED_NODES) > MAX_EXPANDED_NODES:
        raise YamlLimitError(f"more than {MAX_EXPANDED_NODES:,} values once its aliases are expanded")
    return data
