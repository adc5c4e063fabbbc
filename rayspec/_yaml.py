"""Bounds on a YAML document before it is built: how many nodes its aliases expand to.

An alias repeats a node without copying it; whatever walks the data afterwards (OmegaConf's
merge, a profile's checks, the ``repr`` in an error message) visits every repeat, so a file of
nested aliases (a "billion laughs") expands past memory. :func:`expanded_nodes` counts them on
the composed node graph, nothing built; the experiment reader and the twin's profile reader
refuse a document past :data:`YAML_MAX_NODES`.
"""

from __future__ import annotations

import yaml

__all__ = ["YAML_MAX_NODES", "expanded_nodes"]

YAML_MAX_NODES = 100_000
"""The most values (scalars, lists, mappings) a document may expand to."""


def expanded_nodes(root: yaml.Node) -> int:
    """How many nodes ``root`` holds once every alias is expanded (counted, not built).

    Raises:
        ValueError: an alias refers to a node that contains it (a recursive document).
    """
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # iterative: a deeply nested document must not hit the recursion limit
        node, children_done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        children: list[yaml.Node] = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
        )
        if children_done:
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            continue
        if key in sizes:
            if sizes[key] < 0:
                raise ValueError("an alias refers to a node that contains it")
            continue
        sizes[key] = -1  # in progress
        stack.append((node, True))
        for child in children:
            if sizes.get(id(child), 0) < 0:
                raise ValueError("an alias refers to a node that contains it")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]
