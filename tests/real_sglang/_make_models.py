"""Make the tiny models of the real-SGLang tests; run by the SGLang env's Python.

Usage: python _make_models.py OUT_DIR

Writes four model folders under OUT_DIR, all offline and seeded (same bytes on every run):

* ``target``: a random Llama (8 layers of width 128, 1024-token vocabulary) with a byte-level
  BPE tokenizer trained here and a small chat template;
* ``draft``: a random EAGLE-3 drafter for it, with SGLang's weight names
  (``sglang/srt/models/llama_eagle3.py``) and the target layers it reads in ``eagle_config``;
* ``agree-target`` / ``agree-draft``: copies whose final norm weights are zero, so every logit
  is 0 and both models always pick token 0: the drafter is always right (accept length =
  steps + 1).
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from safetensors.torch import save_file
from tokenizers import Tokenizer
from tokenizers import decoders
from tokenizers import models
from tokenizers import pre_tokenizers
from tokenizers import trainers
from transformers import LlamaConfig
from transformers import LlamaForCausalLM
from transformers import PreTrainedTokenizerFast

SEED = 20261201
VOCAB = 1024
HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 8
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
INIT_STD = 0.05  # wider than the default 0.02: greedy picks with clear margins in bfloat16
# SGLang's default capture for 8 Llama layers is layers {2, 4, 5}: ids [1, 3, 4] (it adds one).
AUX_LAYER_IDS = [1, 3, 4]
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
        number = str(rng.randint(0, 9999))
        words.insert(rng.randint(0, len(words)), number)
        line = " ".join(words)
        lines.append(line[0].upper() + line[1:] + rng.choice([".", "?", "!", ","]))
    return lines


def make_tokenizer(out: Path, rng: random.Random) -> PreTrainedTokenizerFast:
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
        model_max_length=2048,
    )
    missing = VOCAB - len(fast)
    if missing > 0:  # a small corpus may run out of merges: fill the rows the model has
        fast.add_tokens([f"<extra_{i}>" for i in range(missing)])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def make_target(out: Path) -> LlamaConfig:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        initializer_range=INIT_STD,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return config


def make_draft(out: Path, target: LlamaConfig) -> None:
    h, kv = HIDDEN, KV_HEADS * HEAD_DIM
    gen = torch.Generator().manual_seed(SEED + 1)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * INIT_STD).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=torch.bfloat16)

    weights = {
        "fc.weight": rand(h, len(AUX_LAYER_IDS) * h),
        "embed_tokens.weight": rand(VOCAB, h),
        "lm_head.weight": rand(VOCAB, h),
        "norm.weight": ones(h),
        "midlayer.input_layernorm.weight": ones(h),
        "midlayer.hidden_norm.weight": ones(h),
        "midlayer.post_attention_layernorm.weight": ones(h),
        # the draft layer attends over [embedding, fused hidden]: input width 2h
        "midlayer.self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, 2 * h),
        "midlayer.self_attn.k_proj.weight": rand(kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": rand(h, HEADS * HEAD_DIM),
        "midlayer.mlp.gate_proj.weight": rand(INTERMEDIATE, h),
        "midlayer.mlp.up_proj.weight": rand(INTERMEDIATE, h),
        "midlayer.mlp.down_proj.weight": rand(h, INTERMEDIATE),
    }
    out.mkdir(parents=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = target.to_dict()
    config.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=1,
        draft_vocab_size=VOCAB,
        target_hidden_size=h,
        eagle_config={
            "eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS,
            "use_aux_hidden_state": True,
        },
    )
    (out / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))


def zero_final_norm(src: Path, dst: Path, name: str) -> None:
    shutil.copytree(src, dst)
    path = dst / "model.safetensors"
    weights = load_file(str(path))
    if name not in weights:
        raise SystemExit(f"{src}: no {name} among {sorted(weights)}")
    weights[name] = torch.zeros_like(weights[name])
    save_file(weights, str(path), metadata={"format": "pt"})


def main(out: Path) -> None:
    rng = random.Random(SEED)
    target = out / "target"
    make_tokenizer(target, rng)
    config = make_target(target)
    make_draft(out / "draft", config)
    zero_final_norm(target, out / "agree-target", "model.norm.weight")
    zero_final_norm(out / "draft", out / "agree-draft", "norm.weight")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
