"""Logits of a trained run's Megatron checkpoint vs its Hugging Face export (fp32, CPU).

    python hf_roundtrip.py RUN_DIR HF_EXPORT_DIR OUT_JSON
"""

import json
import sys

import torch


def main(run_dir: str, hf_dir: str, out_file: str) -> None:
    from nemo_topr.model import cpu_runtime
    from nemo_topr.utils.distributed import initialize_model_parallel

    cpu_runtime.enable_cpu_runtime()
    initialize_model_parallel()
    from megatron.bridge import AutoBridge
    from transformers import AutoModelForCausalLM

    from nemo_topr.model.source import resolve

    megatron_model = AutoBridge.from_hf_pretrained(hf_dir).load_megatron_model(
        str(resolve(run_dir).checkpoint), wrap_with_ddp=False)[0].eval()
    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    vocab = hf_model.config.vocab_size
    tokens = torch.randint(0, vocab, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        megatron_logits = megatron_model(tokens, torch.arange(40).expand(2, 40), None)[..., :vocab]
        hf_logits = hf_model(tokens).logits
    json.dump({"max_abs_diff": (megatron_logits - hf_logits).abs().max().item(),
               "logit_scale": hf_logits.abs().max().item()}, open(out_file, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
