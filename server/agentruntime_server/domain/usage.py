"""A handle's counters as one value: what a host bills from and budgets check."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Usage:
    turns: int = 0  # the handle's own model round trips
    own_tokens: int = 0  # the handle's own spend
    total_tokens: int = 0  # the spend of the handle's whole subtree
    tool_calls: int = 0  # the handle's own tool calls (task calls included)
    subtree_tool_calls: int = 0  # the tool calls of the handle's whole subtree (budgets)

    def after_reply(self, tokens: int) -> Usage:
        """The handle that made a model call, after its reply."""
        return Usage(
            self.turns + 1, self.own_tokens + tokens, self.total_tokens + tokens, self.tool_calls, self.subtree_tool_calls
        )

    def after_descendant_reply(self, tokens: int) -> Usage:
        """An ancestor of the handle that made a model call: only its subtree's spend grows."""
        return Usage(self.turns, self.own_tokens, self.total_tokens + tokens, self.tool_calls, self.subtree_tool_calls)

    def after_call(self) -> Usage:
        return Usage(self.turns, self.own_tokens, self.total_tokens, self.tool_calls + 1, self.subtree_tool_calls + 1)

    def after_descendant_call(self) -> Usage:
        return Usage(self.turns, self.own_tokens, self.total_tokens, self.tool_calls, self.subtree_tool_calls + 1)
