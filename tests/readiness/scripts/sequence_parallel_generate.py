"""torchrun worker: greedy generate of a small Llama on neuron, tensor-parallel over the ranks,
with Llama's own plan and with the benchmark's sequence-parallel plan; prints the largest
difference of the two runs' scores and whether their tokens agree."""

import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.distributed import DistributedConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import _sequence_parallel  # noqa: E402

dist.init_process_group("neuron")
rank = dist.get_rank()
torch.neuron.set_device(rank)
_sequence_parallel.register()
config = LlamaConfig(
    vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
)  # fmt: skip
path = [tempfile.mkdtemp() if rank == 0 else None]
dist.broadcast_object_list(path)
if rank == 0:
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path[0])
dist.barrier()
prompt = torch.randint(3, 256, (1, 16), generator=torch.Generator().manual_seed(1)).to("neuron")
runs, rows = [], []
for plan in ("auto", _sequence_parallel.PLAN):
    model = LlamaForCausalLM.from_pretrained(path[0], distributed_config=DistributedConfig(tp_plan=plan)).eval()
    # the rows the second layer gets in the prefill: all 16, or this rank's 8
    hook = model.model.layers[1].register_forward_pre_hook(lambda m, a: rows.append(a[0].shape[1]))
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False, cache_implementation="static",
            disable_compile=True, pad_token_id=0, output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
    hook.remove()
    runs.append((out.sequences.cpu(), torch.stack(out.scores).cpu()))
(seq_a, scores_a), (seq_b, scores_b) = runs
same_inf = torch.equal(torch.isinf(scores_a), torch.isinf(scores_b))  # min_new_tokens masks EOS with -inf
diff = (scores_a - scores_b).nan_to_num(0.0).abs().max().item()
print(
    f"RANK {rank} ROWS {rows[0]},{rows[4]} TOKENS_EQUAL {bool(torch.equal(seq_a, seq_b))} SAME_INF {same_inf} MAXDIFF {diff:.3e}"
)
dist.destroy_process_group()
