"""Make the models of the CPU landscape; run by the SGLang env's Python (torch, transformers).

Usage: python make_models.py OUT_DIR

Writes, offline and seeded (the same bytes on every run):

* ``target``: a float32 Llama (width 1024, 8 layers, 16 heads, 4 KV heads, MLP 2816,
  1024-token vocabulary) that is *functionally one layer*: layers 1-7 compute their attention
  and MLP in full but their ``o_proj`` and ``down_proj`` are zero, so they add nothing to the
  residual. Its token embeddings are scaled tiny, so the residual after layer 0 is the attention
  output (RMSNorm makes layer 0's input scale-free). A decode step costs eight layers of
  weights; what it computes is layer 0.
* ``draft-<name>``: EAGLE-3 drafters (SGLang's ``LlamaForCausalLMEagle3``) whose one layer is
  the target's layer 0: q/k/v read the embedding half of the draft's input (the hidden half is
  zero), ``fc`` is zero (the fused target features are ignored), and the norms, MLP and
  ``lm_head`` are the target's. The final norm is the target's times ``FINAL_NORM_SCALE`` with
  ``norm_output`` on, so the hidden state a draft step hands the next (its residual) is tiny
  next to the attention output, and the logits are a scaled copy (argmax unchanged). So the
  exact drafter predicts the target's next token (it misses only the first token of the
  sequence, which the draft's shifted cache never holds). Each named drafter adds Gaussian noise
  of its own relative scale to every weight of its layer and its ``lm_head``: graded agreement.

The tokenizer is a byte-level BPE trained on a few thousand generated sentences, like the
real-SGLang tests' (copied, so that their recipe can change without changing these models).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import trainers
from transformers import LlamaConfig
from transformers import PreTrainedTokenizerFast

SEED = 20261215
VOCAB = 1024
HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 32
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
INIT_STD = 0.05
QK_STD = 0.15  # sharper attention than INIT_STD gives at width 128
EMBED_SCALE = 0.005  # embeddings of RMS 2.5e-4: the residual after layer 0 is its attention output
# RMSNorm divides by sqrt(mean(x^2) + eps): an eps far below every normed mean square keeps the
# norms scale-free (with the default 1e-5, the 1e-3 embeddings would be normed by eps, not by
# their own size)
RMS_EPS = 1e-10
FINAL_NORM_SCALE = 1e-4  # a draft step's hidden output, next to an O(1) attention output
# Layers after the drafter's first cost their compute and add nothing (o_proj, down_proj zero),
# as the target's do: a draft step then costs about a sixth of a verify, so that deeper drafts
# stop paying within steps 1-5 for the strongest drafter too (docs/landscapes.md).
DRAFT_DEAD_LAYERS = 4
AUX_LAYER_IDS = [1, 3, 4]  # any valid ids: fc is zero, the draft ignores what they capture
# name -> relative noise scale on the draft's weights (0: the exact drafter)
DRAFTERS = {"strong": 0.04, "mid": 0.08, "weak": 0.18}
SPECIALS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
WORDS = (
    "the a one two three red blue green fast slow model token server draft target tree chain "
    "node step accept verify cache batch prompt answer river stone cloud light north south "
    "east west river garden window table paper music number letter story question engine "
    "signal packet socket thread kernel memory vector matrix tensor layer weight graph"
).split()


def corpus(rng: random.Random, n: int = 4000) -> list[str]:
    lines = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        words.insert(rng.randint(0, len(words)), str(rng.randint(0, 9999)))
        line = " ".join(words)
        lines.append(line[0].upper() + line[1:] + rng.choice([".", "?", "!", ","]))
    return lines


def make_tokenizer(out: Path, rng: random.Random) -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=4096,
    )
    missing = VOCAB - len(fast)
    if missing > 0:  # a small corpus may run out of merges: fill the rows the model has
        fast.add_tokens([f"<extra_{i}>" for i in range(missing)])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=4096,
        rms_norm_eps=RMS_EPS,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
    )


def target_weights(gen: torch.Generator) -> dict[str, torch.Tensor]:
    h, q, kv, m = HIDDEN, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, INTERMEDIATE

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * INIT_STD

    w = {
        "model.embed_tokens.weight": rand(VOCAB, h) * EMBED_SCALE,
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": rand(VOCAB, h),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
        w[p + "self_attn.q_proj.weight"] = rand(q, h) * (QK_STD / INIT_STD)
        w[p + "self_attn.k_proj.weight"] = rand(kv, h) * (QK_STD / INIT_STD)
        w[p + "self_attn.v_proj.weight"] = rand(kv, h)
        w[p + "mlp.gate_proj.weight"] = rand(m, h)
        w[p + "mlp.up_proj.weight"] = rand(m, h)
        # layers past the first cost their compute and add nothing to the residual
        live = i == 0
        w[p + "self_attn.o_proj.weight"] = rand(h, q) if live else torch.zeros(h, q)
        w[p + "mlp.down_proj.weight"] = rand(h, m) if live else torch.zeros(h, m)
    return w


def draft_weights(
    t: dict[str, torch.Tensor], noise: float, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    h = HIDDEN
    layer = "model.layers.0."

    def noisy(x: torch.Tensor) -> torch.Tensor:
        if noise == 0.0:
            return x.clone()
        return x + noise * x.std() * torch.randn(x.shape, generator=gen)

    def embed_half(x: torch.Tensor) -> torch.Tensor:  # [out, h] -> [out, 2h], hidden half zero
        return torch.cat([noisy(x), torch.zeros_like(x)], dim=1)

    weights = {
        "fc.weight": torch.zeros(h, len(AUX_LAYER_IDS) * h),
        "norm.weight": t["model.norm.weight"] * FINAL_NORM_SCALE,
        "lm_head.weight": noisy(t["lm_head.weight"]),
        "midlayer.input_layernorm.weight": t[layer + "input_layernorm.weight"].clone(),
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": t[
            layer + "post_attention_layernorm.weight"
        ].clone(),
        "midlayer.self_attn.q_proj.weight": embed_half(t[layer + "self_attn.q_proj.weight"]),
        "midlayer.self_attn.k_proj.weight": embed_half(t[layer + "self_attn.k_proj.weight"]),
        "midlayer.self_attn.v_proj.weight": embed_half(t[layer + "self_attn.v_proj.weight"]),
        "midlayer.self_attn.o_proj.weight": noisy(t[layer + "self_attn.o_proj.weight"]),
        "midlayer.mlp.gate_proj.weight": noisy(t[layer + "mlp.gate_proj.weight"]),
        "midlayer.mlp.up_proj.weight": noisy(t[layer + "mlp.up_proj.weight"]),
        "midlayer.mlp.down_proj.weight": noisy(t[layer + "mlp.down_proj.weight"]),
    }
    for i in range(1, 1 + DRAFT_DEAD_LAYERS):  # the target's layer i, dead as it is there
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        for name in (
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        ):
            weights[dst + name] = t[src + name].clone()
        weights[dst + "hidden_norm.weight"] = torch.ones(h)
    return weights


def save(out: Path, weights: dict[str, torch.Tensor], cfg: dict[str, object]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(torch.float32).contiguous() for k, v in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True))


def main(out: Path) -> None:
    target = out / "target"
    make_tokenizer(target, random.Random(SEED))
    cfg = config()
    cfg.architectures = ["LlamaForCausalLM"]
    gen = torch.Generator().manual_seed(SEED)
    weights = target_weights(gen)
    save(target, weights, cfg.to_dict())
    for i, (name, noise) in enumerate(DRAFTERS.items()):
        dcfg = cfg.to_dict()
        dcfg.update(
            architectures=["LlamaForCausalLMEagle3"],
            model_type="llama",
            num_hidden_layers=1 + DRAFT_DEAD_LAYERS,
            draft_vocab_size=VOCAB,
            target_hidden_size=HIDDEN,
            norm_output=True,
            rayspec_landscape_noise=noise,  # read back into the recording's metadata
            eagle_config={
                "eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS,
                "use_aux_hidden_state": True,
            },
        )
        dgen = torch.Generator().manual_seed(SEED + 1 + i)
        save(out / f"draft-{name}", draft_weights(weights, noise, dgen), dcfg)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
