#!/usr/bin/env python3
"""peft_llama_logits.py BASE ADAPTER MERGED LOGITS: loads tessera's plain
Hugging Face export BASE with transformers' AutoModelForCausalLM (fp32,
eager attention), puts tessera's PEFT export ADAPTER on it with
peft.PeftModel.from_pretrained, and checks that its logits on LOGITS's
input_ids equal the logits tessera computed with its LoRA model (LOGITS: a
safetensors file of input_ids [B, T] and logits [B, T, V]) within 1e-5
relative per row; then the same for tessera's --merge export MERGED loaded
alone. Every adapter tensor must have been loaded (none missing or
unexpected), and the adapter must change the base model's logits.

Exits 77 and says why when torch, transformers, peft or safetensors is not
importable (tests/unit/test_llama_roundtrip.cpp reports SKIPPED then).
Run by that test; not meant to be run alone.
"""
import sys


def load(transformers, torch, path):
    kwargs = {"attn_implementation": "eager", "output_loading_info": True}
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, **kwargs)
    except TypeError:  # transformers 4 names it torch_dtype
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            path, torch_dtype=torch.float32, **kwargs)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        raise RuntimeError(f"from_pretrained({path}) reported {info}")
    return model.eval()


def worst_row(got, want):
    return ((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)).max().item()


def main():
    try:
        import peft
        import torch
        import transformers
        from safetensors.torch import load_file
    except Exception as e:  # ImportError, or a broken install
        print(f"torch/transformers/peft/safetensors not importable ({e})")
        return 77
    base_dir, adapter_dir, merged_dir, logits_file = sys.argv[1:5]
    t = load_file(logits_file)
    ids, want = t["input_ids"].long(), t["logits"].double()
    base = load(transformers, torch, base_dir)
    with torch.no_grad():
        plain = base(input_ids=ids).logits.double()
    model = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
    saved = load_file(adapter_dir + "/adapter_model.safetensors")
    loaded = {k for k in model.state_dict() if "lora_" in k}
    if len(loaded) != len(saved):
        print(f"PEFT made {len(loaded)} adapter tensors, the export holds {len(saved)}")
        return 1
    with torch.no_grad():
        got = model(input_ids=ids).logits.double()
    merged = load(transformers, torch, merged_dir)
    with torch.no_grad():
        got_merged = merged(input_ids=ids).logits.double()
    if got.shape != want.shape or got_merged.shape != want.shape:
        print(f"logits {tuple(got.shape)}, {tuple(got_merged.shape)}; tessera's {tuple(want.shape)}")
        return 1
    err, err_merged, moved = worst_row(got, want), worst_row(got_merged, want), worst_row(plain, want)
    print(f"peft {peft.__version__}, transformers {transformers.__version__}, torch "
          f"{torch.__version__}: {len(saved)} adapter tensors; worst row's relative error "
          f"{err:.3e} with PeftModel.from_pretrained, {err_merged:.3e} for the merged export "
          f"(bar 1e-5); the base alone is {moved:.3e} away")
    if moved <= 1e-4:
        print("the adapters do not change the logits: nothing was tested")
        return 1
    return 0 if err <= 1e-5 and err_merged <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
