"""A real MLX model that says what a test chooses: `scripted_model(family, reply, root)`.

It writes a model directory (mlx-lm's `llama` architecture, float32 safetensors, config.json,
and the family's tokenizer files) whose greedy output, after a chat prompt rendered by the
family's template, is exactly `reply`'s tokens. The scripted token's logit is about 80 and every
other's near 0, so sampling at temperature 1 says the same thing.

How it works: one transformer layer looks the next token up from the current token and the K
before it, an n-gram table written into the weights.
- Each token of the script (the prompt's end, `after`, and the reply) gets a code, a unit vector
  of r numbers (one-hot while they fit in the hidden budget; else spread apart, |dot| <= 0.4);
  every other token gets a flag dimension instead. An embedding row is [1, code, flag, 0...].
- Attention head j (j = 1..K) copies the code of the token j places back into slot j of the
  residual stream. Its queries and keys are constant vectors that RoPE turns so that a query
  scores the key j places back highest, by a margin of 40 over every other place within the
  model's 8,192 positions (rope_theta 10, 32-wide heads; the margin is computed, not hoped for).
- The MLP has one unit per step of the script: it fires only when the slots hold that step's
  context, and writes the next token's code, scaled up, into slot 0.
- The output layer is the embedding (tied), read through the final norm's weights, which keep
  only slot 0's code. Where no step matches (after the script), the current token scores
  highest, so the model repeats it: end a script with the family's end token.

K is the smallest that tells every step apart. Places before `after` are the user's text, which
the script does not know: a step whose context reaches there matches whatever is there. Where a
later step reads the same known tokens and, at those places, tokens of the script (gpt-oss:
`...<|end|><|start|>assistant<|channel|>` comes after the user's message and again after the
analysis), the later step outranks the earlier; the earlier then fails if the user's text ends
with what the later one reads there. script.json lists those endings (`forbidden_endings`):
choose user messages that do not end so, or pass the user's text in `after`.

Built and checked in well under a second once the family's tokenizer is loaded (each scripted
token must win by 30 in a forward pass before anything is written). The vocabulary-wide
embedding makes the file 4 x vocabulary x hidden bytes (hidden 1 + (K+1)(r+1), padded to 16,
budgeted to 64: 13 to 52 MB for the replies in examples.py).
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models import llama
from mlx_lm.models.rope_utils import initialize_rope

from tests.families.vocab import tokenizer_at

CONTEXT = 8192  # max_position_embeddings: the positions the attention margin holds over
ROPE_THETA = 10.0
MIN_HEAD_DIM = 32
ATTENTION_MARGIN = 40.0  # score of the wanted place over any other, before softmax
GATE = 200.0  # a unit's gate: GATE/2 on a match, at most GATE * (dot - 1/2) otherwise
OUTRANK = 3  # how much louder a unit of the next rank writes
LOGIT = 80.0  # the scripted token's logit
MIN_GAP = 30.0  # what the check before writing requires of each scripted token
MAX_CONTEXT = 8  # K at most
HIDDEN_BUDGET = 64  # hidden size aimed at (codes get fewer numbers, spread apart)
MAX_COHERENCE = 0.4  # codes that share numbers: |dot| at most this
EPS = 1e-6
FAMILY_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
CHECK_PREFIX = "A user message that the script does not know: 1234, été, 東京."
UNKNOWN = -1  # a place before `after`
Context = tuple[int, ...]  # the current token, then the ones before it


class ScriptError(ValueError):
    """The script cannot be said by a model of this kind (the message says why)."""


def encode(family: Path, text: str | Sequence[int]) -> list[int]:
    """Text as the family's tokens (special tokens written in it become their ids)."""
    if isinstance(text, str):
        return list(tokenizer_at(family).encode(text, add_special_tokens=False))
    return [int(token) for token in text]


def prompt_tail(family: Path, **template_kwargs: Any) -> list[int]:
    """The end of the family's rendered chat prompt that no user message changes: the tokens
    after the user's text, through the generation prompt. `template_kwargs` go to the template
    (mlx-lm's `apply_chat_template` adds `enable_thinking` as the worker's rendering does)."""
    tokenizer = tokenizer_at(family)

    def rendered(text: str) -> list[int]:
        messages = [{"role": "user", "content": text}]
        return list(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, **template_kwargs)
        )

    one, other = rendered("Is it one?"), rendered("Or is it the other!")
    same = 0
    while same < min(len(one), len(other)) and one[-1 - same] == other[-1 - same]:
        same += 1
    return one[len(one) - same :]


def _known(context: Context) -> int:
    """How many places of a context lie within `after` and the reply (they come first)."""
    return sum(1 for token in context if token != UNKNOWN)


def _collide(one: Context, other: Context) -> bool:
    """Whether both contexts can be read at one place: equal wherever both are known."""
    return all(a == b or UNKNOWN in (a, b) for a, b in zip(one, other, strict=True))


@dataclass(frozen=True)
class Unit:
    context: Context
    following: int  # the token it makes next
    rank: int  # outranks every colliding unit of a lower rank (it knows more places)


@dataclass(frozen=True)
class Plan:
    order: int  # K
    units: list[Unit]
    forbidden: list[Context]  # endings of the user's text that would mislead it (oldest first)


@dataclass(frozen=True)
class Script:
    after: tuple[int, ...]  # the prompt's end the reply follows
    reply: tuple[int, ...]

    @property
    def sequence(self) -> tuple[int, ...]:
        return self.after + self.reply

    def steps(self, order: int) -> list[tuple[Context, int]]:
        """(the context of `order` + 1 places, the next token) for each reply token."""
        tokens, start = self.sequence, len(self.after) - 1
        return [
            (tuple(tokens[p - j] if p >= j else UNKNOWN for j in range(order + 1)), tokens[p + 1])
            for p in range(start, len(tokens) - 1)
        ]

    def plan(self) -> Plan:
        """The smallest K that tells every step apart, and the units that make it."""
        clash = ""
        for order in range(MAX_CONTEXT + 1):
            steps = sorted(set(self.steps(order)), key=lambda step: _known(step[0]))
            clash = _first_clash(steps)
            if not clash:
                return Plan(order, _ranked(steps), _forbidden(steps))
        raise ScriptError(
            f"the script repeats {MAX_CONTEXT + 1} tokens with different continuations "
            f"({clash}): change the text"
        )


def _first_clash(steps: list[tuple[Context, int]]) -> str:
    """Two steps that read alike and go on differently (none outranks the other)."""
    for i, (context, following) in enumerate(steps):
        for other, next_other in steps[i + 1 :]:
            alike = _known(other) == _known(context) and _collide(context, other)
            if alike and next_other != following:
                return f"{list(reversed(context))} -> {following} and {next_other}"
    return ""


def _ranked(steps: list[tuple[Context, int]]) -> list[Unit]:
    """A unit per step; a step that collides with one of another continuation that knows fewer
    places ranks above it (`steps` come sorted by how many places they know)."""
    ranks = [0] * len(steps)
    for i, (context, following) in enumerate(steps):
        for j in range(i):
            general, next_general = steps[j]
            if next_general != following and _collide(general, context):
                ranks[i] = max(ranks[i], ranks[j] + 1)
    return [Unit(c, f, rank) for (c, f), rank in zip(steps, ranks, strict=True)]


def _forbidden(steps: list[tuple[Context, int]]) -> list[Context]:
    endings = set()
    for context, following in steps:
        for other, next_other in steps:
            reaches = _known(other) > _known(context) and _collide(context, other)
            if reaches and next_other != following:
                endings.add(tuple(reversed(other[_known(context) : _known(other)])))
    return sorted(endings)


def scripted_model(
    family: Path,
    reply: str | Sequence[int],
    root: Path,
    *,
    after: str | Sequence[int] | None = None,
    name: str | None = None,
    **template_kwargs: Any,
) -> Path:
    """A model directory under `root` (named `name`, else `<family>-<digest>`) whose greedy
    output after `after` is exactly `reply`'s tokens. Text is encoded with the family's
    tokenizer, special tokens included; token ids pass as they are. `after` defaults to
    `prompt_tail(family, **template_kwargs)`. The same arguments give the same directory, built
    once; its script.json records what it says (`read_script`)."""
    script = Script(
        tuple(
            encode(family, after) if after is not None else prompt_tail(family, **template_kwargs)
        ),
        tuple(encode(family, reply)),
    )
    if not script.reply:
        raise ScriptError("the reply is empty")
    return _write(family.resolve(), script, root.resolve(), name)


@functools.cache
def _write(family: Path, script: Script, root: Path, name: str | None) -> Path:
    about = json.loads((family / "family.json").read_text())
    digest = hashlib.sha256(json.dumps([about, script.after, script.reply]).encode()).hexdigest()
    folder = root / (name or f"{about['family']}-{digest[:10]}")
    record = folder / "script.json"
    if record.is_file() and json.loads(record.read_text()).get("digest") == digest:
        return folder
    vocab_size = int(about["vocab_size"])
    outside = [t for t in script.sequence if not 0 <= t < vocab_size]
    if outside:
        raise ScriptError(f"tokens outside the vocabulary of {vocab_size}: {outside[:5]}")
    plan = script.plan()
    config, weights = build_weights(script, plan, vocab_size)
    strangers = [t for t in encode(family, CHECK_PREFIX) if t not in set(script.sequence)]
    check(config, weights, script, strangers)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for file in FAMILY_FILES:
        if (family / file).is_file():
            shutil.copyfile(family / file, folder / file)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    mx.save_safetensors(
        str(folder / "model.safetensors"),
        {key: mx.array(value) for key, value in weights.items()},
        metadata={"format": "mlx"},
    )
    tokenizer = tokenizer_at(family)
    forbidden = [list(ending) for ending in plan.forbidden]
    about = {
        "digest": digest,
        "family": about["family"],
        "after": list(script.after),
        "reply": list(script.reply),
        "after_text": tokenizer.decode(list(script.after)),
        "reply_text": tokenizer.decode(list(script.reply)),
        "context_tokens": plan.order + 1,
        "forbidden_endings": forbidden,
        "forbidden_endings_text": [tokenizer.decode(ending) for ending in forbidden],
    }
    record.write_text(json.dumps(about, ensure_ascii=False, indent=1))
    return folder


def read_script(model: Path) -> dict[str, Any]:
    """What a scripted model says, from its script.json: `after` and `reply` (token ids),
    `after_text` and `reply_text` (their decoded text), `context_tokens` (K + 1),
    `forbidden_endings` and `forbidden_endings_text` (see the module)."""
    loaded: dict[str, Any] = json.loads((model / "script.json").read_text())
    return loaded


def worker_env(model: Path) -> dict[str, str]:
    """The settings that make a worker (worker/ops/cluster.py's `start_worker(**env)`) serve a
    scripted model as the model named `model.name`: the folder holding it as MLXQ_MODELS_DIR,
    and no native one-row products module (it would first be compiled into that folder)."""
    return {
        "MLXQ_MODELS_DIR": str(model.parent),
        "MLXQ_MODEL": model.name,
        "MLXQ_CPU_MATVEC": "false",
    }


# The weights


def codes(count: int, width: int, seed: int = 0) -> np.ndarray:
    """`count` unit vectors of `width` numbers: one-hot when they fit, else spread apart (the
    larger dot products pushed down by a few hundred steps of repulsion)."""
    if count <= width:
        return np.eye(count, width)
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((count, width))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for _ in range(400):
        dots = vectors @ vectors.T
        np.fill_diagonal(dots, 0)
        vectors -= 0.05 * (dots**3) @ vectors
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


def coherence(vectors: np.ndarray) -> float:
    """The largest |dot| between two of the vectors."""
    dots = np.abs(vectors @ vectors.T)
    np.fill_diagonal(dots, 0)
    return float(dots.max(initial=0.0))


def _codes_for(count: int, order: int) -> np.ndarray:
    """As many numbers per code as the hidden budget allows; more if the codes would come out
    too alike to tell apart."""
    width = min(count, max(8, (HIDDEN_BUDGET - 1) // (order + 1) - 1))
    while True:
        vectors = codes(count, width)
        if count <= width or coherence(vectors) <= MAX_COHERENCE:
            return vectors
        width += 4


def attention_gap(head_dim: int) -> float:
    """The least, over every other place within CONTEXT, of sum_f (1 - cos(d * theta_f)): how
    much lower a place d != 0 away from the wanted one scores, per unit of query-key scale."""
    thetas = ROPE_THETA ** (-np.arange(0, head_dim, 2) / head_dim)
    distances = np.arange(-MAX_CONTEXT, CONTEXT)
    distances = distances[distances != 0]
    return float((1 - np.cos(np.outer(distances, thetas))).sum(axis=1).min())


def _norm_factor(squared_norm: float, hidden: int) -> float:
    """What RMSNorm (weight 1) multiplies a vector of this squared norm by."""
    return float(1 / np.sqrt(squared_norm / hidden + EPS))


@dataclass(frozen=True)
class Layout:
    """Where things sit in the residual stream: 0 holds 1; slot s holds a code and a flag."""

    width: int  # numbers per code
    order: int

    @property
    def slot(self) -> int:
        return self.width + 1

    @property
    def hidden(self) -> int:
        return -(-(1 + (self.order + 1) * self.slot) // 16) * 16

    def dims(self, s: int) -> slice:
        return slice(1 + s * self.slot, 1 + (s + 1) * self.slot)

    def code_dims(self, s: int) -> slice:
        return slice(1 + s * self.slot, 1 + s * self.slot + self.width)


def build_weights(
    script: Script, plan: Plan, vocab_size: int
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config.json, the weights by name)."""
    known = sorted(set(script.sequence))
    vectors = _codes_for(len(known), plan.order)
    at = Layout(vectors.shape[1], plan.order)
    code_of = {token: vectors[i] for i, token in enumerate(known)}
    hidden, heads = at.hidden, max(plan.order, 1)
    head_dim = max(MIN_HEAD_DIM, at.slot + at.slot % 2)

    embed = np.zeros((vocab_size, hidden))
    embed[:, 0] = 1.0
    embed[:, at.dims(0).stop - 1] = 1.0  # the flag: a token the script does not know
    for token in known:
        embed[token, at.dims(0)] = np.append(code_of[token], 0.0)

    # Attention: head j - 1 copies the code j places back into slot j.
    kappa = _norm_factor(2.0, hidden)  # every embedding row has squared norm 2
    scale = ATTENTION_MARGIN * np.sqrt(head_dim) / attention_gap(head_dim)
    query = np.full(head_dim, np.sqrt(scale / 2))  # each rotated pair: squared norm `scale`
    q_proj = np.zeros((heads * head_dim, hidden))
    k_proj = np.zeros((heads * head_dim, hidden))
    v_proj = np.zeros((heads * head_dim, hidden))
    o_proj = np.zeros((hidden, heads * head_dim))
    rope = initialize_rope(head_dim, ROPE_THETA, False, None, CONTEXT)
    for h in range(plan.order):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        copied = slice(h * head_dim, h * head_dim + at.slot)
        # A key turned by j places: the query j places later meets it unturned.
        key = rope(mx.array(query, dtype=mx.float32)[None, None, None, :], offset=h + 1)
        q_proj[rows, 0] = query / kappa
        k_proj[rows, 0] = np.array(key).reshape(-1) / kappa
        v_proj[copied, at.dims(0)] = np.eye(at.slot) / kappa
        o_proj[at.dims(h + 1), copied] = np.eye(at.slot)

    # MLP: a unit per step, firing when each known place matches, writing the next token's code
    # (OUTRANK times louder per rank).
    nu = _norm_factor(2.0 + plan.order, hidden)
    gate = np.zeros((len(plan.units), hidden))
    up = np.zeros((len(plan.units), hidden))
    down = np.zeros((hidden, len(plan.units)))
    fired = GATE / 2 / (1 + np.exp(-GATE / 2))  # silu(GATE / 2)
    for u, unit in enumerate(plan.units):
        for s, token in enumerate(unit.context[: _known(unit.context)]):
            gate[u, at.code_dims(s)] = GATE * code_of[token] / nu
        gate[u, 0] = GATE * (0.5 - _known(unit.context)) / nu
        up[u, 0] = 1 / nu
        down[at.code_dims(0), u] = code_of[unit.following] * 10 * OUTRANK**unit.rank / fired

    # The output: the tied embedding, through a final norm that keeps slot 0's code only.
    final = np.zeros(hidden)
    final[at.code_dims(0)] = LOGIT / np.sqrt(hidden)

    layer = "model.layers.0."
    weights = {
        "model.embed_tokens.weight": embed,
        layer + "input_layernorm.weight": np.ones(hidden),
        layer + "post_attention_layernorm.weight": np.ones(hidden),
        layer + "self_attn.q_proj.weight": q_proj,
        layer + "self_attn.k_proj.weight": k_proj,
        layer + "self_attn.v_proj.weight": v_proj,
        layer + "self_attn.o_proj.weight": o_proj,
        layer + "mlp.gate_proj.weight": gate,
        layer + "mlp.up_proj.weight": up,
        layer + "mlp.down_proj.weight": down,
        "model.norm.weight": final,
    }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": 1,
        "intermediate_size": len(plan.units),
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": head_dim,
        "rms_norm_eps": EPS,
        "vocab_size": vocab_size,
        "rope_theta": ROPE_THETA,
        "rope_traditional": False,
        "tie_word_embeddings": True,
        "max_position_embeddings": CONTEXT,
        "torch_dtype": "float32",
    }
    return config, {key: value.astype(np.float32) for key, value in weights.items()}


def check(
    config: dict[str, Any], weights: dict[str, np.ndarray], script: Script, prefix: list[int]
) -> None:
    """Run the model on `prefix` (a user's text), the prompt's end and the reply: each reply
    token must be the argmax where it is due, by at least MIN_GAP."""
    fields = llama.ModelArgs.__dataclass_fields__
    model = llama.Model(llama.ModelArgs(**{k: v for k, v in config.items() if k in fields}))
    model.load_weights([(key, mx.array(value)) for key, value in weights.items()])
    tokens = [*prefix, *script.sequence]
    logits = np.array(model(mx.array(tokens)[None])[0].astype(mx.float32))
    start = len(prefix) + len(script.after) - 1
    for i, expected in enumerate(script.reply):
        row = logits[start + i]
        others = np.where(np.arange(row.size) == expected, -np.inf, row)
        if row[expected] - others.max() < MIN_GAP:
            raise ScriptError(
                f"reply token {i} ({expected}) scores {row[expected]:.1f} and token "
                f"{int(others.argmax())} {others.max():.1f}: the construction failed its check"
            )
