"""The PRISM backend's routing, made once per step (vllm_prism.attention.ops.mixed.StepPlan):
uniform steps launch over the whole batch with no index tensor (what a full CUDA graph can
replay), mixed steps write their index lists into the caller's persistent buffer."""

from __future__ import annotations

import pytest
import torch

from vllm_prism.attention.ops.mixed import StepPlan

CPU = torch.device("cpu")


@pytest.mark.parametrize("lens,decode,verify", [([1, 1, 1, 1], [0, 1, 2, 3], []),
                                                ([6, 6, 6], [], [0, 1, 2])])
def test_uniform_steps_have_no_index_tensors(lens, decode, verify) -> None:
    plan = StepPlan.build(lens, CPU)
    assert (plan.decode, plan.verify, plan.prefill) == (decode, verify, [])
    assert plan.decode_ids is None and plan.verify_ids is None
    assert plan.verify_len == (6 if verify else 0)


def test_mixed_step_fills_the_persistent_buffer() -> None:
    buf = torch.full((2, 8), -1, dtype=torch.int32)
    plan = StepPlan.build([1, 40, 5, 1, 0, 3], CPU, ids_buffer=buf)
    assert (plan.decode, plan.verify, plan.prefill) == ([0, 3], [2, 5], [1])
    assert plan.verify_len == 5
    assert plan.decode_ids.data_ptr() == buf[0].data_ptr()
    assert plan.verify_ids.data_ptr() == buf[1].data_ptr()
    assert plan.decode_ids.tolist() == [0, 3] and plan.verify_ids.tolist() == [2, 5]
    # the next step reuses the same addresses
    again = StepPlan.build([3, 1, 1], CPU, ids_buffer=buf)
    assert again.decode_ids.data_ptr() == buf[0].data_ptr()
    assert again.decode_ids.tolist() == [1, 2] and again.verify_ids.tolist() == [0]


def test_backend_declares_uniform_batch_graphs() -> None:
    pytest.importorskip("vllm.v1.attention.backends.triton_attn")
    from vllm.v1.attention.backend import AttentionCGSupport

    from vllm_prism.attention.backends.prism_attn import PrismAttentionMetadataBuilder

    assert PrismAttentionMetadataBuilder._cudagraph_support is AttentionCGSupport.UNIFORM_BATCH


def test_builder_lets_a_draft_graph_skip_build(tiny_gguf) -> None:
    """A built PRISM builder tells vLLM's speculators that a FULL-graph draft step may skip
    build() (the in-place refresh, Triton's no-op), as the Triton builder does: our kernels
    read the persistent device buffers its metadata views (prism_attn.py says why)."""
    pytest.importorskip("vllm.v1.attention.backends.triton_attn")
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_prism.attention.backends.prism_attn import PrismAttentionMetadataBuilder

    cfg = EngineArgs(model=str(tiny_gguf()), max_model_len=256).create_engine_config()
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                             dtype=torch.bfloat16)
    with set_current_vllm_config(cfg):
        builder = PrismAttentionMetadataBuilder(spec, ["layer"], cfg, CPU)
    assert builder.supports_draft_decode_metadata_update is True


def test_routing_reads_no_device_value() -> None:
    """The builder routes every step from the host copy of query_start_loc: the device
    seq_lens are never copied to the host for it (that was one GPU sync a step). A meta
    tensor has no data, so any read of it fails."""
    from vllm_prism.attention.ops.metadata import AttentionMetadata

    md = AttentionMetadata(block_table=torch.zeros(3, 4, dtype=torch.int32),
                           seq_lens=torch.empty(3, dtype=torch.int32, device="meta"),
                           query_start_loc=torch.empty(4, dtype=torch.int32, device="meta"),
                           max_query_len=4, max_seq_len=9,
                           query_start_loc_cpu=torch.tensor([0, 1, 5, 9], dtype=torch.int32))
    assert md.query_lens() == [1, 4, 4] and md.num_tokens == 9
    with pytest.raises(NotImplementedError):  # seq_lens are copied only where read
        md.host_seq_lens()
