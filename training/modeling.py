"""Model and tokenizer loading: Hub id or folder, a config with random weights, or a preset."""

from __future__ import annotations

import difflib
import inspect
import json
import sys
import types
from pathlib import Path
from typing import Any

from .args import LLAMA_SHAPED_MODEL_TYPES, ArgumentError, TrainArgs, config_overrides, parse_args
from .engines.facts import FACTS
from .offline import hub_load

ASSETS = Path(__file__).parent / "assets"
SHIPPED_TOKENIZER = ASSETS / "tokenizer.json"

# Named configs that build offline. The gpt2-* presets keep GPT-2's real vocabulary size
# (padded to a multiple of 64 for the matrix units) so benchmark FLOPs are honest.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-gpt2": {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 512},
    "tiny-bert": {
        "model_type": "bert",
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
    },
    "gpt2-small": {
        "model_type": "gpt2",
        "n_layer": 12,
        "n_head": 12,
        "n_embd": 768,
        "n_positions": 1024,
        "vocab_size": 50304,
    },
    "gpt2-xl": {
        "model_type": "gpt2",
        "n_layer": 48,
        "n_head": 25,
        "n_embd": 1600,
        "n_positions": 1024,
        "vocab_size": 50304,
    },
    # Llama 3.2 1B's shapes (1.24B parameters): grouped-query attention (32 query heads, 8 key/value
    # heads), RoPE (theta 500,000), SwiGLU, RMSNorm, tied embeddings, no dropout; its real
    # vocabulary size with the shipped tokenizer. Sequences of 2048 (--block-size 2048).
    "llama-1b": {
        "model_type": "llama",
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
        "max_position_embeddings": 2048,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_dropout": 0.0,
        "attention_bias": False,
        "mlp_bias": False,
    },
    # Llama 3.1 8B's shapes (8.03B parameters): 32 blocks of width 4096, grouped-query attention
    # (32 query heads, 8 key/value heads), SwiGLU of 14336, untied embeddings and LM head. RoPE
    # without Llama 3.1's long-context frequency scaling, which matters only past 8192 positions.
    "llama-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "attention_bias": False,
        "mlp_bias": False,
    },
}

TASK_AUTO_CLASS = {
    "classification": "AutoModelForSequenceClassification",
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
}


def load_tokenizer(args: TrainArgs):
    from transformers import AutoTokenizer

    name = args.tokenizer or args.model
    if name:
        with hub_load("--tokenizer" if args.tokenizer else "--model", name, ArgumentError):
            tok = AutoTokenizer.from_pretrained(name, use_fast=True)
    elif args.model_config and not Path(args.model_config).exists():
        with hub_load("--model-config", args.model_config, ArgumentError):
            tok = AutoTokenizer.from_pretrained(args.model_config, use_fast=True)
    else:
        tok = shipped_tokenizer()
    # GPT-2 style tokenizers ship without a pad token; batching needs one.
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def shipped_tokenizer():
    """The byte-level BPE tokenizer trained on the shipped data (training/assets/generate.py)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_file=str(SHIPPED_TOKENIZER),
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        cls_token="<cls>",
        sep_token="<sep>",
    )


def build_config(args: TrainArgs, tokenizer, num_labels: int | None, id2label: dict[int, str] | None):
    config = _base_config(args, tokenizer, num_labels, id2label)
    _override(config, config_overrides(args))
    return config


def _override(config, pairs: dict[str, str]) -> None:
    """--config-overrides, each name checked against the config so a typo is an error, not a no-op."""
    for key, value in pairs.items():
        if not hasattr(config, key):
            keys = sorted(set(config.to_dict()) | set(getattr(config, "attribute_map", {})))
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ArgumentError(
                f"--config-overrides {key}={value}: {type(config).__name__} has no '{key}' "
                f"({hint}its config.json names the keys it has)"
            )
        try:
            config.update_from_string(f"{key}={value}")
        except (ValueError, TypeError) as e:  # a value of the wrong type (Python's words), or of no type it sets
            current = getattr(config, key)
            kinds = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
            kind = next((words for t, words in kinds.items() if isinstance(current, t)), None)
            if kind is None:  # None, a list, a dict: transformers parses none of them from text
                raise ArgumentError(
                    f"--config-overrides {key}={value}: {key} is {str(current)[:40]} here, which --config-overrides "
                    "cannot set (it sets integers, numbers, true/false and text): write it in a --model-config file"
                ) from e
            raise ArgumentError(
                f"--config-overrides {key}={value}: {key} takes {kind} (now {current!r}), not {value!r}"
            ) from e


def check_overrides_offline(args: TrainArgs) -> tuple[bool | None, str]:
    """Whether --config-overrides fit the model's config, known before the job starts, with no
    download and no torch: (True, ""), (False, what is wrong), or (None, why it is checked only
    when the job starts: a Hub model whose config is not in this machine's cache)."""
    from transformers import AutoConfig

    pairs = config_overrides(args)
    name = args.model or args.model_config
    if name:
        try:
            config = AutoConfig.from_pretrained(name, local_files_only=True)
        except (OSError, ValueError, ImportError):  # not cached here; or a config only its own code reads
            where = "could not be read here" if Path(name).exists() else "is not in this machine's Hugging Face cache"
            return None, f"checked when the job starts: {name}'s config {where}"
    else:
        preset = dict(PRESETS[args.preset or "tiny-gpt2"])
        config = AutoConfig.for_model(preset.pop("model_type"), **preset)
    try:
        _override(config, pairs)
    except ArgumentError as e:
        return False, str(e)
    return True, ""


def check_overrides_main() -> None:
    """`check_overrides_offline` for a launcher that imports no transformers (nor torch, which
    transformers would import): training flags as a JSON list on stdin, the answer as a JSON
    object on stdout. Its caller blocks torch (only configs are read) and the Hub (HF_HUB_OFFLINE)."""
    ok, detail = check_overrides_offline(parse_args(json.load(sys.stdin)))
    print(json.dumps({"ok": ok, "detail": detail}))


def _base_config(args: TrainArgs, tokenizer, num_labels: int | None, id2label: dict[int, str] | None):
    from transformers import AutoConfig

    extra: dict[str, Any] = {}
    if num_labels is not None:
        id2label = id2label or {i: f"LABEL_{i}" for i in range(num_labels)}  # transformers' default names
        extra.update(num_labels=num_labels, id2label=id2label, label2id={v: k for k, v in id2label.items()})
    if args.model:
        return AutoConfig.from_pretrained(args.model, **extra)
    if args.model_config:
        return AutoConfig.from_pretrained(args.model_config, **extra)
    preset = dict(PRESETS[args.preset or "tiny-gpt2"])
    model_type = preset.pop("model_type")
    preset.setdefault("vocab_size", len(tokenizer))
    preset["pad_token_id"] = tokenizer.pad_token_id
    if model_type in ("gpt2", "llama"):
        preset["bos_token_id"] = preset["eos_token_id"] = tokenizer.eos_token_id
    return AutoConfig.for_model(model_type, **preset, **extra)


def load_model(args: TrainArgs, tokenizer, num_labels: int | None = None, id2label: dict[int, str] | None = None):
    import transformers

    flag, name = ("--model", args.model) if args.model else ("--model-config", args.model_config)
    with hub_load(flag, name, ArgumentError):  # a preset (no name) needs no Hub
        config = build_config(args, tokenizer, num_labels, id2label)
        if config.pad_token_id is None:
            config.pad_token_id = tokenizer.pad_token_id
        auto = getattr(transformers, TASK_AUTO_CLASS[args.task])
        kwargs = {"attn_implementation": "sdpa"} if _supports_sdpa(auto, config) else {}
        if args.model:
            model = auto.from_pretrained(args.model, config=config, **kwargs)
        else:
            model = auto.from_config(config, **kwargs)
    if args.task == "causal-lm" and getattr(model.config, "_attn_implementation", None) == "sdpa":
        _unmasked_causal_attention(model)
    if args.task == "causal-lm" and getattr(model, "loss_type", "") is None:
        # transformers picks the loss from the class name, and GPT2LMHeadModel matches none: every
        # forward then looks it up through a logged warning, which Dynamo cannot trace, so the
        # compiled model split in two just before its loss. ForCausalLM is its fallback anyway.
        model.loss_type = "ForCausalLM"
    if model.get_input_embeddings().num_embeddings < len(tokenizer):
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
    return model


def training_forward(model) -> None:
    """Make the model's forward the one the trainer needs: no key/value cache unless a caller
    asks for one, and in training mode, when a loss is computed, only the loss.

    Both are outputs nothing in training reads, and under torch.compile each unread output that
    requires grad costs the forward a write and the backward a zero gradient to fill and read:
    - Decoders default to use_cache=True and build a cache in training too. Each layer's keys
      and values became graph outputs, and their zero gradients were added in the kernel that
      took 5.3% of GPT-2 small's compiled step on an H100. generate() still gets its cache: it
      passes use_cache itself.
    - Under bf16/fp16, accelerate converts a prepared model's outputs to fp32. The logits
      (16 x 1024 x 50304 for GPT-2 small) were an fp32 graph output: 3.3 GB written, then
      zero-filled and read in the backward. Dropping them inside the forward makes the copy dead
      code; on H100s it took ours from 1.27-1.31x to 1.34-1.42x the Trainer baseline measured
      in the same runs (bench/README.md).
    Evaluation (eval mode) and forwards without labels still return the logits.
    """
    signature = inspect.signature(type(model).forward)
    takes_cache = "use_cache" in signature.parameters

    def forward(self, *args, **kwargs):
        if takes_cache:
            kwargs.setdefault("use_cache", False)
        if self.training and self.__dict__.get(HEAD_LOSS) and kwargs.get("labels") is not None:
            from transformers.modeling_outputs import CausalLMOutputWithPast

            from .losses import head_loss

            labels = kwargs.pop("labels")
            hidden = getattr(self, self.base_model_prefix)(*args, **kwargs)[0]
            weight = self.get_output_embeddings().weight
            return CausalLMOutputWithPast(loss=head_loss(hidden, weight, labels, fp8=self.__dict__.get(HEAD_LOSS_FP8)))
        out = type(self).forward(self, *args, **kwargs)
        if self.training and getattr(out, "loss", None) is not None:
            return type(out)(loss=out.loss)
        return out

    # The class's signature (with self), which generate() inspects. A method, not a closure:
    # accelerate rebinds what it unwraps to the model.
    forward.__signature__ = signature  # type: ignore[attr-defined]  # inspect.signature reads it
    model.forward = types.MethodType(forward, model)


HEAD_LOSS = "_distrain_head_loss"  # set on a model whose training forward computes losses.head_loss
HEAD_LOSS_FP8 = "_distrain_head_loss_fp8"  # --fp8-head: head_loss's `fp8` ("exact" or "fast")
# Causal LMs whose forward is exactly: the base model, then a bias-free linear head, then
# ForCausalLMLoss. Others (logit soft-capping, scaled logits, heads with a bias) keep their own.
HEAD_LOSS_MODEL_TYPES = ("gpt2", *LLAMA_SHAPED_MODEL_TYPES)


def head_loss_flags_why_not(args: TrainArgs, engine: str) -> str | None:
    """Why the training flags rule out losses.head_loss under `engine` (a name of engines/facts.py),
    or None. Torch-free: the run's decisions (decisions.decide) hold it, and the launcher's memory
    estimate reads it there."""
    if args.lm_loss != "fast":
        return "--lm-loss model"
    if args.task != "causal-lm" or args.fused_ce:
        return "not the causal-lm loss"
    if not FACTS[engine].head_loss:
        return f"--strategy {args.strategy} holds the LM head its own way"
    if args.precision == "fp16":
        # The gradient is computed before fp16's loss scale reaches it, and small ones would flush to zero.
        return "--precision fp16"
    return None


def use_head_loss(model, flags_why_not: str | None, fp8: str | None = None) -> str | None:
    """Make the training forward compute losses.head_loss (--lm-loss fast) where the run's flags
    allow it (`flags_why_not`: the decisions' head_loss_why_not) and the model does; why not,
    where it does not. `fp8` (--fp8-head): the head multiplies in float8, its backward accumulating
    "fast" or "exact"; a head that cannot is refused (ArgumentError)."""
    why = flags_why_not or _head_loss_model_why_not(model)
    if fp8 is not None:
        from .losses import fp8_head_why_not

        vocab, hidden = model.get_output_embeddings().weight.shape if why is None else (0, 0)
        problem = why or fp8_head_why_not(hidden, vocab)
        if problem:
            raise ArgumentError(f"--fp8-head: the LM head cannot multiply in float8 here: {problem}; drop --fp8-head")
    if why is None:
        model.__dict__[HEAD_LOSS] = True
        model.__dict__[HEAD_LOSS_FP8] = fp8
    return why


def fp8_head_model_why_not(model) -> str | None:
    """Why this model's LM head cannot multiply in float8 inside losses.head_loss, or None: the
    reason for the head loss itself, else the head's sizes'."""
    from .losses import fp8_head_why_not

    why = _head_loss_model_why_not(model)
    if why is None:
        vocab, hidden = model.get_output_embeddings().weight.shape
        why = fp8_head_why_not(hidden, vocab)
    return why


def _head_loss_model_why_not(model) -> str | None:
    """Why this model's training forward cannot compute losses.head_loss, or None."""
    import torch

    config, head = model.config, model.get_output_embeddings()
    if config.model_type not in HEAD_LOSS_MODEL_TYPES or getattr(model, "loss_type", None) != "ForCausalLM":
        return f"{config.model_type} models: the model's own loss"
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return "an LM head other than a bias-free linear layer"
    if any(getattr(config, k, None) for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")):
        return "logits scaled or capped by the model"
    return None


def _unmasked_causal_attention(model) -> None:
    """Let SDPA run its causal kernel instead of a dense mask.

    Packed causal-LM blocks have no padding, so their attention mask is exactly causal. Under
    torch.compile with torch < 2.14, transformers still materialises it as a [B, 1, T, T]
    tensor, which rules out the flash kernels and does all T x T of the work (measured on an
    H100: the masked cuDNN kernel took 26% of a GPT-2-small step). An attention function
    registered under its own name gets no mask built for it; with no mask,
    `sdpa_attention_forward` passes is_causal=True when q_length > 1, and plain attention to
    the cache when decoding one token, which is what generation needs.
    """
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError:  # older transformers: keep its own masking
        return
    AttentionInterface.register("distrain_causal_sdpa", sdpa_attention_forward)
    model.set_attn_implementation("distrain_causal_sdpa")


def _supports_sdpa(auto, config) -> bool:
    try:
        model_class = auto._model_mapping[type(config)]
    except (KeyError, AttributeError):
        return False
    return bool(getattr(model_class, "_supports_sdpa", False))


def count_parameters(model) -> int:
    # Under ZeRO-3 a parameter is an empty placeholder; ds_numel is its real size.
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
