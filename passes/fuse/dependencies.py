"""Which groups a node depends on, with groups as units.

A group becomes one kernel call, so a node that reads any member of group G depends on everything
G depends on, including what G's later members bring in after the node was seen. Recording, per
node, only the groups reached so far goes stale as groups grow and merge, and a fusion that looks
legal can then close a cycle (group H reads X, X reads G, G later takes a node that reads H).
:class:`Dependencies` keeps each node's direct group dependencies and each group's own, and answers
"does this node depend on that group" by walking the group-level graph, so every check sees the
groups as they are now.
"""
from __future__ import annotations

import torch.fx


class Dependencies:
    """Group-level dependencies of the nodes seen so far (see the module docstring). Sets of
    group ids are int bitmasks: bit ``i`` stands for group ``i`` (or the group it merged into)."""

    def __init__(self) -> None:
        self._direct: dict[torch.fx.Node, int] = {}
        self._of_group: dict[int, int] = {}
        self._alias: dict[int, int] = {}
        self._ids: dict[int, int] = {}      # group id -> bits of every id merged into it
        self._member: dict[torch.fx.Node, int] = {}   # node -> the group it joined

    def _find(self, gid: int) -> int:
        root = gid
        while root in self._alias:
            root = self._alias[root]
        while gid != root:
            self._alias[gid], gid = root, self._alias[gid]
        return root

    def record(self, node: torch.fx.Node, group_of: dict) -> None:
        """Note what ``node`` reads; when it belongs to a group, the group depends on that too.
        Call again after ``node`` joins a group (it is idempotent)."""
        deps = 0
        for arg in node.all_input_nodes:
            deps |= self._direct.get(arg, 0)
            if arg in group_of:
                deps |= 1 << group_of[arg].id
        self._direct[node] = deps
        group = group_of.get(node)
        if group is not None:
            self._member[node] = group.id
            gid = self._find(group.id)
            self._of_group[gid] = self._of_group.get(gid, 0) | deps

    def reaches(self, node: torch.fx.Node, gid: int) -> bool:
        """True when ``node`` (not a member of the group) needs group ``gid``'s kernel to run first.
        A node inside another group is produced by that group's kernel, so it needs whatever that
        group needs (what the group's later members read included)."""
        root = self._find(gid)
        target = self._ids.get(root, 1 << root)
        seen, frontier = 0, self._direct.get(node, 0)
        if node in self._member:
            own = self._find(self._member[node])
            frontier |= self._of_group.get(own, 0)
        while frontier:
            if frontier & target:
                return True
            seen |= frontier
            grown = 0
            while frontier:
                low = frontier & -frontier
                frontier ^= low
                grown |= self._of_group.get(self._find(low.bit_length() - 1), 0)
            frontier = grown & ~seen
        return False

    def merged(self, target: int, other: int) -> None:
        """Group ``other`` was absorbed into ``target``: one unit from now on."""
        target, other = self._find(target), self._find(other)
        if target != other:
            self._alias[other] = target
            self._ids[target] = self._ids.get(target, 1 << target) | self._ids.pop(other, 1 << other)
            self._of_group[target] = self._of_group.get(target, 0) | self._of_group.pop(other, 0)
