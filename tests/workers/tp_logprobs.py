"""Per-token log-probs of one tiny Llama at a given tensor-parallel size.

    torchrun --nproc_per_node=TP tp_logprobs.py TP CKPT_DIR OUT_FILE

TP=1 initialises the model, saves it as a Megatron distributed checkpoint in CKPT_DIR and
writes its log-probs; TP>1 loads that checkpoint resharded (Megatron's own resharding, which
handles the fused QKV and SwiGLU layouts) and writes its log-probs from rank 0.
"""

import os
import sys

import torch


def main(tp: int, ckpt_dir: str, out_file: str) -> None:
    from nemo_topr.model import cpu_runtime
    from nemo_topr.utils.distributed import destroy_model_parallel, initialize_model_parallel

    cpu_runtime.enable_cpu_runtime()
    initialize_model_parallel(tensor_parallel=tp)
    from megatron.core import dist_checkpointing

    from nemo_topr.model.providers import tiny_llama_provider

    torch.manual_seed(1234)
    provider = tiny_llama_provider(vocab_size=512, seq_length=64)
    provider.tensor_model_parallel_size = tp
    provider.finalize()
    model = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)[0]
    if tp == 1:
        os.makedirs(ckpt_dir, exist_ok=True)
        dist_checkpointing.save(model.sharded_state_dict(), ckpt_dir)
    else:
        model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), ckpt_dir))
    model.eval()

    generator = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 512, (3, 48), generator=generator)
    labels = torch.randint(0, 512, (3, 48), generator=generator)
    position_ids = torch.arange(48).expand(3, 48)
    with torch.no_grad():
        # labels path: vocab-parallel cross-entropy over the sharded logits, no gather
        token_logprobs = -model(tokens, position_ids, None, labels=labels)
    if torch.distributed.get_rank() == 0:
        torch.save({"token_logprobs": token_logprobs, "tp": tp,
                    "vocab_shard": model.output_layer.weight.shape[0]}, out_file)
    destroy_model_parallel()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
