"""What a training forward keeps for backward, per token and decoder layer, at the R1-Distill-Qwen-1.5B
width: the figure the memory plan needs without gradient checkpointing, where every layer's saved set is
held until backward reaches it.

    python bench/saved_activations.py        (CPU, a few minutes; writes bench/results/saved_activations.json)

Why: on the H100 under a 23.5 GiB cap, ``grpo.tune`` ran ``gradient_checkpointing: false`` at the
micro-batch the plan said fits (9 sequences, 22.59 GiB) and it ran out of memory; at 4 sequences the
training phase peaked at 22.26 GiB (bench/RESULTS.md). So the plan's "every layer's live set" under-counts.

How: decoders of 1 and 2 layers at the real width (hidden 1536, MLP 8960, 12 query and 2 key/value heads
of 128; random bf16 weights, a vocabulary of 1,024, which no layer depends on) with the trainer's LoRA (r16
on q/k/v/o), run forward as the trainer does (SDPA attention, as on CUDA; a left-padded batch) under
``torch.autograd.graph.saved_tensors_hooks``, counting each saved storage once, parameters excluded. The
2-layer count less the 1-layer one is one layer's; two lengths show whether any of it grows with the
square of the length. The base is unquantised here: bitsandbytes' 4-bit matmul keeps its input outside
autograd's saved tensors (``ctx.tensors``), which the hooks cannot see; ``F.linear`` saves that same input.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.r1_model import R1_SHAPE  # noqa: E402
from grpo.model.lora import inject_lora  # noqa: E402
from grpo.model.loading import load_policy_model  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def model_dir(root: Path, layers: int) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = root / f"layers{layers}"
    cfg = Qwen2Config(**{**R1_SHAPE, "vocab_size": 1024, "num_hidden_layers": layers}, pad_token_id=0)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


def saved_bytes(path: Path, batch: int, length: int) -> int:
    """Bytes of the distinct storages a forward of ``batch`` x ``length`` tokens saves for backward."""
    model = load_policy_model(path, quantization="none", compute_dtype="bfloat16", device="cpu",
                              gradient_checkpointing=False, attention="sdpa")
    inject_lora(model, r=16, alpha=32, targets=TARGETS)
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    ids = torch.randint(1, 1024, (batch, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, : length // 4] = 0  # a left-padded prompt, as the trainer's batches have
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions,
                                     use_cache=False).last_hidden_state
    del hidden
    return sum(seen.values())


def main() -> None:
    batch, out = 2, {}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {n: model_dir(Path(tmp), n) for n in (1, 2)}
        for length in (128, 256):
            one, two = (saved_bytes(dirs[n], batch, length) for n in (1, 2))
            per_token = (two - one) / (batch * length)
            out[length] = {"one_layer": one, "two_layers": two, "per_token_per_layer": per_token,
                           "per_token_per_layer_over_hidden": per_token / R1_SHAPE["hidden_size"]}
            print(f"length {length}: {per_token:,.0f} bytes a token a layer "
                  f"({per_token / R1_SHAPE['hidden_size']:.1f} x hidden)", flush=True)
    (ROOT / "bench" / "results" / "saved_activations.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
