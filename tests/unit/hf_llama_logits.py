#!/usr/bin/env python3
"""hf_llama_logits.py EXPORT LOGITS: loads tessera's Hugging Face export
EXPORT with transformers' AutoModelForCausalLM.from_pretrained (fp32, eager
attention) and checks that its logits on LOGITS's input_ids equal the
logits tessera computed (LOGITS: a safetensors file of input_ids [B, T]
and logits [B, T, V]) within 1e-5 relative per row, with no missing,
unexpected or mismatched weights.

Exits 77 and says why when torch, transformers or safetensors is not
importable (tests/unit/test_llama_roundtrip.cpp reports SKIPPED then).
Run by that test; not meant to be run alone.
"""
import sys


def main():
    try:
        import torch
        import transformers
        from safetensors.torch import load_file
    except Exception as e:  # ImportError, or a broken install
        print(f"torch/transformers/safetensors not importable ({e})")
        return 77
    export, logits_file = sys.argv[1], sys.argv[2]
    t = load_file(logits_file)
    ids, want = t["input_ids"].long(), t["logits"].double()
    kwargs = {"attn_implementation": "eager", "output_loading_info": True}
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            export, dtype=torch.float32, **kwargs)
    except TypeError:  # transformers 4 names it torch_dtype
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            export, torch_dtype=torch.float32, **kwargs)
    problems = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if problems or info.get("error_msgs"):
        print(f"from_pretrained({export}) reported {info}")
        return 1
    model.eval()
    with torch.no_grad():
        got = model(input_ids=ids).logits.double()
    if got.shape != want.shape:
        print(f"logits {tuple(got.shape)}, tessera's {tuple(want.shape)}")
        return 1
    err = ((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)).max().item()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: "
          f"{type(model).__name__} from {export}, worst row's relative error {err:.3e} "
          f"(bar 1e-5)")
    return 0 if err <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
