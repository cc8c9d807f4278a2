"""The commented manifest ``moehome owner new`` writes: the template (a small Mixtral-style
model reading bytes, this computer's aggregator and trainer listed), or ``[model]`` made
of a checkpoint's configuration (``owner new --from``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.project.manifest import NAME_PATTERN

TEMPLATE = """\
# moehome project manifest. Edit, then: moehome owner publish {filename}
# Everything here is signed with your owner key and checked by every volunteer.

[project]
name = "{name}"                 # lowercase letters, digits and '-'
description = {description}
min_app_version = "0.1.0"          # volunteers with an older app are asked to update

{model}[model.wire]
# How expert inputs/outputs (activations) and their gradients travel between trainers
# and volunteers: raw (float32), f16, bf16, q8, q4, q3 (blockwise quantized, bits per
# value), q4z (q4 deflated). q8 costs about a quarter of raw's bytes; q4z a tenth, at
# some accuracy (docs/decisions/009-throughput.md).
activations = "q8"
gradients = "q8"

{data}[training]
optimizer = "adam"                 # sgd, adam or adamw, run by the aggregators
trainer_optimizer = "adamw"        # the trainers' own layers: adamw, or muon (hidden
                                   #   matrices; AdamW for embeddings, head, vectors): on
                                   #   the demo's model better at its own rate (--lr 1e-2)
learning_rate = 0.001              # the experts' Adam steps on the robust rule's momentum
                                   #   (below): tuned on a one-process model, divide by 2-3
contribution_samples = 512         # a volunteer sends its gradients every N samples...
contribution_seconds = 30.0        # ...or once a round, just before it closes (every T
                                   #   seconds until the aggregator has said when)
staleness_bound = 4                # contributions older than this many versions are refused
round_samples = 4096               # an aggregator steps once this many samples arrived...
round_seconds = 60.0               # ...or this long after the round before it (volunteers
                                   #   are told when a round closes and send just before)
min_contributors = 2               # ...and never with fewer distinct volunteers (it waits;
                                   #   3 or more once volunteers are many: one attacker
                                   #   facing one honest volunteer has no majority)

[training.aggregation]
rule = "centered_clip"             # centered_clip (robust default), median, trimmed_mean, mean
clip_radius = 1.0                  # clipping radius, as a multiple of the median distance
momentum = 0.9                     # per-volunteer momentum kept by the aggregator
buckets = 2                        # contributions are averaged in random groups of this size
trim_fraction = 0.2                # for trimmed_mean

[training.schedule]
# The trainer-side layers' learning rate over the trainer's steps: learning_rate times
# a factor that warms up, then stays (constant) or decays (cosine, wsd).
kind = "constant"                  # constant, cosine, or wsd (warmup-stable-decay)
warmup = 0                         # steps of linear warmup up to learning_rate
total = 10000                      # the step where cosine and wsd reach min_ratio (and stay)
decay_fraction = 0.2               # wsd: the last share of total that decays, linearly
min_ratio = 0.1                    # the final rate, as a share of learning_rate
weight_decay = 0.0                 # adamw: decoupled; adam, sgd: an L2 term in the gradient
clip_norm = 1.0                    # gradients are clipped to this norm (0: never)

[training.expert_schedule]
# The same for the experts, stepped by the aggregators: counted in each expert's versions.
kind = "constant"                  # constant, cosine, or wsd (warmup-stable-decay)
warmup = 0                         # versions of linear warmup up to learning_rate
total = 10000                      # the version where cosine and wsd reach min_ratio
decay_fraction = 0.2               # wsd: the last share of total that decays, linearly
min_ratio = 0.1                    # the final rate, as a share of learning_rate
weight_decay = 0.0                 # adamw: decoupled; adam, sgd: an L2 term in the gradient
clip_norm = 0.0                    # each version's aggregated gradient is clipped (0: never)

[training.trunk]
# With two or more [[trainers]], their trainer-side layers (embeddings, attention, gating,
# head) meet through the aggregators: each trainer sends its change every sync_every
# steps; the sum of the trainers' changes makes a new version they all rebase onto.
sync_every = 2
outer_learning_rate = 1.0
outer_momentum = 0.0               # Nesterov momentum over the versions (0: measured best)
round_seconds = 5.0                # a version waits this long for every trainer's change

[training.audit]
# Trainers recompute a random share of the expert answers they get, from the published
# weights of the version each answer names; a volunteer whose answer is not what those
# weights compute is excluded at once.
answer_rate = 0.05                 # the share recomputed (0.05: a cheater on every answer
                                   # is caught within 100 answers with probability 0.994)
answer_rows = 0.25                 # the share of an audited answer's rows recomputed
weights_mib = 256                  # memory for the weights of audited versions
# Aggregators recompute a random share of the contributions they accept, from the
# inputs and output gradients their receipts commit to (volunteers keep them, within
# kept_mib, until the aggregator says whether it audits).
contribution_rate = 0.05
kept_mib = 256
ban_hours = 24.0                   # a caught cheater is banned this long, project-wide
pardoned = []                      # peer ids whose bans you lift (publish again to apply)

# One block per aggregator: its public key (hex; `moehome aggregator key` on its machine
# prints it). Volunteers find its addresses in the swarm (it publishes them, signed);
# `addrs` is needed only to reach it without a lookup, e.g. at a fixed public port.
{aggregators}
# One block per trainer allowed to sign receipts (`moehome owner trainer-key` on the
# trainer's machine prints its key).
{trainers}
{weights}"""

DEFAULT_MODEL = """\
[model]
architecture = "mixtral"           # transformers' Mixtral layers (attention with rotary
                                   #   embeddings, RMS norms); the experts are SwiGLU blocks
                                   #   (or "byte": moehome's small byte model)
dtype = "bfloat16"                 # what volunteers hold and compute the experts in
                                   #   (half the memory and wire bytes of float32, and
                                   #   tensor cores; gradients are summed in float32)
vocab_size = 257                   # the tokenizer's ids: bytes are 256 and the end of text
hidden = 64                        # width of the trainer-side layers and of every expert
context = 64                       # tokens per training sample
expert_prefix = "ffn"              # experts are named <prefix><layer>.<i>.<j>, e.g. ffn0.1.3
mixture_layers = 2                 # layers, each with a mixture of experts
grid = [2, 4]                      # experts per layer, as a grid (beam search runs over it;
                                   #   at most 16384 a layer, 65536 in all)
k_best = 2                         # experts per token (Mixtral's 2 of 8)
k_min = 1                          # answers needed before the trainer goes on
heads = 4                          # attention heads (hidden / heads: each head's width)
kv_heads = 2                       # key/value heads (fewer than heads: grouped-query attention)
router_aux_loss = 0.01             # weight of the router's load-balancing loss

[model.expert]
kind = "swiglu"                    # swiglu (mixtral's) or ffn (the byte model's)
hidden = 64                        # must equal model.hidden
inner = 128                        # the SwiGLU block's width
activation = "silu"
blocks = 1                         # SwiGLU blocks per expert: compute per byte on the wire
                                   #   grows with it (Mixtral export needs 1)

"""

DEFAULT_WEIGHTS = """\
[weights]
seed = 0                           # initial weights are made from this seed...
# folder = "weights/"              # ...unless a folder of <uid>.safetensors files is given
"""


DEFAULT_DESCRIPTION = "A small Mixtral-style language model trained by volunteers."

#: What ``model_block`` says beside each field of ``[model]`` and ``[model.expert]``.
MODEL_COMMENTS: dict[str, str] = {
    "architecture": "mixtral: transformers' Mixtral layers, SwiGLU experts",
    "dtype": "what volunteers hold and compute the experts in",
    "vocab_size": "token ids (bytes: 256 and the end of text)",
    "hidden": "width of the trainer-side layers and of every expert",
    "context": "tokens per training sample",
    "expert_prefix": "experts are named <prefix><layer>.<i>, e.g. ffn0.3",
    "mixture_layers": "mixture-of-experts layers in the model",
    "grid": "experts per layer (one dimension: a router's exactly)",
    "k_best": "experts asked per token",
    "k_min": "answers needed before the trainer goes on",
    "heads": "attention heads",
    "kv_heads": "key/value heads (fewer: grouped-query attention)",
    "rope_theta": "the rotary embedding's base",
    "rms_norm_eps": "the RMS norms' epsilon",
    "router_aux_loss": "weight of the router's load-balancing loss",
    "tie_embeddings": "the output head shares the embedding's weights",
    "expert.kind": "mixtral's experts: w2(silu(w1 x) * w3 x)",
    "expert.hidden": "must equal model.hidden",
    "expert.inner": "feed-forward width",
    "expert.activation": "",
    "expert.blocks": "blocks per expert (Mixtral export needs 1)",
}


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def _commented(key: str, value: Any, comment: str) -> str:
    line = f"{key} = {_toml_value(value)}"
    return f"{line:<34} # {comment}" if comment else line


def model_block(fields: Mapping[str, Any]) -> str:
    """``[model]`` and ``[model.expert]`` of a manifest, commented, from the fields of
    ``ModelSection`` (``expert``: a table of ``ExpertSection``'s); what ``moehome owner
    new --from`` writes from a checkpoint's configuration."""
    lines = ["[model]"]
    lines += [
        _commented(k, v, MODEL_COMMENTS.get(k, "")) for k, v in fields.items() if k != "expert"
    ]
    lines += ["", "[model.expert]"]
    lines += [
        _commented(k, v, MODEL_COMMENTS.get(f"expert.{k}", ""))
        for k, v in fields.get("expert", {}).items()
    ]
    return "\n".join(lines) + "\n\n"


def manifest_text(
    name: str,
    filename: str,
    *,
    aggregator_key: str | None = None,
    trainer_key: str | None = None,
    description: str = DEFAULT_DESCRIPTION,
    model: Mapping[str, Any] | None = None,
    tokenizer: str | None = None,
    weights_folder: str | None = None,
    vocab_size: int | None = None,
) -> str:
    """The commented manifest (``write_template``'s), by default of the small byte model;
    ``model``: the fields of ``[model]`` instead (``model_block``), ``tokenizer``: a
    ``[data]`` section pinning it ("bytes" or a tokenizer.json's sha256),
    ``weights_folder``: the initial weights' folder (``[weights] folder``),
    ``vocab_size``: the default model's, for ``tokenizer``'s vocabulary."""
    if not re.match(NAME_PATTERN, name):
        raise ValueError(
            f"project name {name!r}: lowercase letters, digits and '-', at most 48, "
            f"e.g. {suggest_name(name)!r}"
        )
    aggregators = (
        f'[[aggregators]]                    # this computer\'s\nkey = "{aggregator_key}"'
        if aggregator_key
        else '# [[aggregators]]\n# key = "..."\n# addrs = ["/ip4/203.0.113.7/tcp/4001/p2p/..."]'
    )
    trainers = (
        f'[[trainers]]                       # this computer\'s\nkey = "{trainer_key}"'
        if trainer_key
        else '# [[trainers]]\n# key = "..."'
    )
    data = ""
    if tokenizer is None and model is None:  # the template's own model reads bytes
        tokenizer = "bytes"
    if tokenizer is not None:
        said = (
            "bytes (and the end of text, id 256), or a tokenizer.json's sha256"
            if tokenizer == "bytes"
            else "the sha256 of the project's tokenizer.json"
        )
        data = f"[data]\n{_commented('tokenizer', tokenizer, said)}\n\n"
    weights = DEFAULT_WEIGHTS
    if weights_folder is not None:
        weights = (
            "[weights]\n"
            + _commented("seed", 0, "unused: the initial weights are in the folder:")
            + "\n"
            + _commented("folder", weights_folder, "<uid>.safetensors, trunk.safetensors")
            + "\n"
        )
    return TEMPLATE.format(
        name=name,
        filename=filename,
        description=json.dumps(description),
        model=_default_model(vocab_size) if model is None else model_block(model),
        data=data,
        aggregators=aggregators,
        trainers=trainers,
        weights=weights,
    )


def _default_model(vocab_size: int | None) -> str:
    if vocab_size is None:
        return DEFAULT_MODEL
    line = next(x for x in DEFAULT_MODEL.splitlines() if x.startswith("vocab_size = "))
    said = "the tokenizer's ids (its vocabulary)"
    return DEFAULT_MODEL.replace(line, _commented("vocab_size", vocab_size, said))


def write_template(
    path: Path,
    name: str,
    *,
    aggregator_key: str | None = None,
    trainer_key: str | None = None,
    tokenizer: tuple[str, int] | None = None,
) -> None:
    """Write the commented manifest; ``aggregator_key`` and ``trainer_key`` (hex): this
    computer's, listed so that the project runs here as written; ``tokenizer``: (sha256,
    vocabulary) of the tokenizer.json the project pins (default: bytes)."""
    if path.exists():
        raise FileExistsError(f"{path} exists; not overwriting it")
    path.write_text(
        manifest_text(
            name,
            path.name,
            aggregator_key=aggregator_key,
            trainer_key=trainer_key,
            tokenizer=None if tokenizer is None else tokenizer[0],
            vocab_size=None if tokenizer is None else tokenizer[1],
        )
    )


def suggest_name(text: str) -> str:
    """A valid project name made of ``text`` ("My LM" -> "my-lm")."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48].strip("-")
    return slug or "my-project"
