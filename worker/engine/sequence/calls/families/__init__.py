"""Each model family's own tool-call syntax, one module a family, and the table that says which
a model writes (`syntax_for`).

A family module names its markers, parses a region of its calls, says which malformations it
tolerates and whether a forced call can be written in it (families/syntax.py's `CallSyntax`).
mlxq's module replaces mlx-lm's parser for a family where that one is wrong or missing; for the
others mlx-lm's parser is kept (families/mlx_lm_parsers.py). docs/api.md's table of families
lists which is which.

Adding a family: a module with its `SYNTAX`, a row below (the mlx-lm parser it replaces, or how
its template is told apart), and its cases in tests/families/data/tool_calls/.
"""

from __future__ import annotations

from collections.abc import Callable

from worker.engine.sequence.calls.families import (
    deepseek_dsml,
    deepseek_v3,
    glm,
    kimi_k2,
    minimax_m2,
    mistral,
    qwen3_coder,
)
from worker.engine.sequence.calls.families.syntax import CallSyntax

# mlx-lm's parser (its module's name) -> mlxq's syntax for that family, which replaces it.
REPLACED: dict[str, CallSyntax] = {
    "qwen3_coder": qwen3_coder.SYNTAX,  # truncates at a literal </parameter>, misses bare calls
    "glm47": glm.SYNTAX,  # a lost <arg_key>/<arg_value> opener garbles the call
    "kimi_k2": kimi_k2.SYNTAX,  # right, but its list of calls was read as no call
    "minimax_m2": minimax_m2.SYNTAX,  # truncates at a literal </parameter>; lists
    "mistral": mistral.SYNTAX,  # no end marker, which mlxq's scanner read as an empty call
}
# Families mlx-lm has no parser for, told apart by their chat template.
BY_TEMPLATE: list[tuple[Callable[[str | None], bool], CallSyntax]] = [
    (deepseek_dsml.writes_this, deepseek_dsml.SYNTAX),
    (deepseek_v3.writes_this, deepseek_v3.SYNTAX),
]


def syntax_for(mlx_lm_parser: str | None, template: str | None) -> CallSyntax | None:
    """mlxq's syntax for a model whose tokenizer uses `mlx_lm_parser` (None: mlx-lm found
    none) and has this chat template; None: no family module of mlxq's is the model's."""
    if mlx_lm_parser is not None:
        return REPLACED.get(mlx_lm_parser)
    return next((syntax for writes, syntax in BY_TEMPLATE if writes(template)), None)


__all__ = ["REPLACED", "CallSyntax", "syntax_for"]
