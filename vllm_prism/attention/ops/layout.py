"""The paged KV cache these kernels read: vLLM 0.32's TRITON_ATTN layout, BF16 or INT8.

What vLLM 0.32 allocates (read from ``vllm/v1/attention/backends/triton_attn.py``,
``vllm/v1/kv_cache_layout.py`` and ``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py``):

* Every per-layer cache is handed to the backend as the *logical* 4-D tensor
  ``(num_blocks, num_kv_heads, block_size, content)`` (``[B, H, N, C]``, RFC #42082); its
  physical strides follow the resolved ``KVCacheLayout``. The default for TRITON_ATTN (which
  declares no preference) is ``LBNHC`` = NHD: memory order block -> slot -> head -> content,
  so ``stride(1) = content`` and ``stride(2) = num_kv_heads * content``. HND layouts
  (``LBHNC``/``BLHNC``/``BHLNC``) give ``stride(2) = content``, ``stride(1) = block_size *
  content``. The kernels here take the logical tensor with any strides (content contiguous).
* BF16 / FP16 (``--kv-cache-dtype auto|bfloat16``): ``content = 2 * head_size`` elements of
  the cache dtype, ``[K(hs) | V(hs)]`` (the backend splits the last dim at ``head_size``).
* ``int8_per_token_head``: ``TritonAttentionBackend.customize_spec`` sets the content to
  ``(hs_k + hs_v) * 1 + 2 * 4`` bytes, and ``TritonAttentionImpl._ensure_scale_caches`` reads it
  as ``[K(hs) | K scale (4 bytes) | V(hs) | V scale (4 bytes)]`` per (block, head, slot): the
  scales are float32 values stored in the 4 bytes after each int8 row (byte offsets ``hs`` and
  ``2 * hs + 4``), at the row's own block/slot/head strides. The writer
  (``_reshape_cache_per_token_head``) computes ``scale = max(absmax(x_row) / 127, 1e-6)`` per
  (token, head) in fp32, stores ``q = clamp(trunc(x / scale +- 0.5), -128, 127)`` (round half
  away from zero), so **dequant = int8 * scale**. For head_size 256 a row is 520 bytes: the K
  row starts 8-byte aligned, the V row 4-byte aligned.

Block sizes: TRITON_ATTN accepts any multiple of 16 (``MultipleOf(16)``). For a hybrid model
such as Bonsai (Qwen3.5: gated-delta-net layers + full attention) vLLM raises the attention
block size until an attention page is at least a mamba page (``Platform.update_block_size_for_
backend``), which gives large multiples of 16 (hundreds of tokens), and the kernel block size is
the manager's. The kernels therefore take the block size at run time and allow any value.

This module also holds the helpers tests and benchmarks use to build such caches and fill them
the way vLLM's writer does (``write_kv``); it never imports vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["INT8_SCALE_BYTES", "KVFormat", "kv_format", "content_size", "make_kv_cache",
           "quantize_per_token_head", "write_kv"]

INT8_SCALE_BYTES = 4
_FLOAT_CACHE = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class KVFormat:
    """Where K, V and their scales sit in one (block, head, slot) content row.

    Offsets and strides are in elements of the cache tensor's dtype (bytes for INT8).
    ``row_align`` is the largest power of two (<= 16 bytes) dividing every row start, so the
    kernels can issue loads that wide.
    """

    is_int8: bool
    head_size: int
    num_kv_heads: int
    block_size: int
    num_blocks: int
    k_off: int
    v_off: int
    k_scale_off: int  # -1 for float caches
    v_scale_off: int
    stride_block: int
    stride_head: int
    stride_slot: int
    row_align: int  # elements

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one token's K and V (all KV heads), scales included."""
        if self.is_int8:
            return self.num_kv_heads * 2 * (self.head_size + INT8_SCALE_BYTES)
        return self.num_kv_heads * 2 * self.head_size * 2


def content_size(head_size: int, dtype: torch.dtype) -> int:
    """Last-dim size of the logical cache for ``dtype`` (int8 = int8_per_token_head)."""
    if dtype == torch.int8:
        return 2 * (head_size + INT8_SCALE_BYTES)
    if dtype in _FLOAT_CACHE:
        return 2 * head_size
    raise ValueError(f"KV cache dtype {dtype} is not supported: use bfloat16/float16 or int8 "
                     "(--kv-cache-dtype int8_per_token_head)")


def kv_format(kv_cache: torch.Tensor, head_size: int | None = None) -> KVFormat:
    """Describe a logical ``(num_blocks, num_kv_heads, block_size, content)`` cache tensor."""
    if kv_cache.dim() != 4:
        raise ValueError(f"expected the logical 4-D KV cache (num_blocks, num_kv_heads, "
                         f"block_size, content), got shape {tuple(kv_cache.shape)}")
    num_blocks, nkv, block_size, content = kv_cache.shape
    if kv_cache.stride(3) != 1:
        raise ValueError("the KV cache content dimension must be contiguous")
    is_int8 = kv_cache.dtype == torch.int8
    if is_int8:
        hs = content // 2 - INT8_SCALE_BYTES
    elif kv_cache.dtype in _FLOAT_CACHE:
        hs = content // 2
    else:
        raise ValueError(f"KV cache dtype {kv_cache.dtype} is not supported")
    if head_size is not None and head_size != hs:
        raise ValueError(f"KV cache content {content} does not match head size {head_size}")
    if hs <= 0 or hs & (hs - 1):
        raise ValueError(f"head size {hs} must be a power of two")
    sb, sh, sn = kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2)
    elem = kv_cache.element_size()
    g = 16
    for v in (sb, sh, sn):
        g = math.gcd(g, (v * elem) % (1 << 40))
    g = math.gcd(g, kv_cache.data_ptr() % 16 or 16)
    align = max(1, g // elem)
    if is_int8:
        return KVFormat(True, hs, nkv, block_size, num_blocks, 0, hs + INT8_SCALE_BYTES, hs,
                        2 * hs + INT8_SCALE_BYTES, sb, sh, sn, align)
    return KVFormat(False, hs, nkv, block_size, num_blocks, 0, hs, -1, -1, sb, sh, sn, align)


def make_kv_cache(num_blocks: int, num_kv_heads: int, block_size: int, head_size: int,
                  dtype: torch.dtype, layout: str = "NHD", device: str | torch.device = "cpu",
                  fill: str = "empty") -> torch.Tensor:
    """A logical cache tensor with vLLM's physical layout: ``NHD`` (default) or ``HND``."""
    c = content_size(head_size, dtype)
    if layout == "NHD":
        shape = (num_blocks, block_size, num_kv_heads, c)
        perm = (0, 2, 1, 3)
    elif layout == "HND":
        shape = (num_blocks, num_kv_heads, block_size, c)
        perm = (0, 1, 2, 3)
    else:
        raise ValueError(f"layout must be NHD or HND, not {layout!r}")
    if fill == "zeros":
        phys = torch.zeros(shape, dtype=dtype, device=device)
    elif fill == "random":
        if dtype == torch.int8:
            phys = torch.randint(-128, 128, shape, dtype=torch.int8, device=device)
        else:
            phys = torch.randn(shape, dtype=dtype, device=device)
    else:
        phys = torch.empty(shape, dtype=dtype, device=device)
    cache = phys.permute(*perm)
    if fill == "random" and dtype == torch.int8:
        # Valid positive scales everywhere, so a random cache dequantizes to finite values.
        hs = head_size
        ks = cache[..., hs:hs + INT8_SCALE_BYTES]
        vs = cache[..., 2 * hs + INT8_SCALE_BYTES:]
        val = (torch.rand(cache.shape[:3], device=device) * 0.02 + 0.005).to(torch.float32)
        b = val.unsqueeze(-1).contiguous().view(torch.int8)
        ks.copy_(b)
        vs.copy_((val * 1.5).unsqueeze(-1).contiguous().view(torch.int8))
    return cache


def quantize_per_token_head(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's int8 per-(token, head) quantizer: ``x [..., hs]`` -> (int8 ``[..., hs]``, fp32
    scale ``[...]``), scale = max(absmax / 127, 1e-6), rounding half away from zero."""
    xf = x.float()
    scale = torch.clamp(xf.abs().amax(-1) / 127.0, min=1e-6)
    y = xf * (1.0 / scale).unsqueeze(-1)
    y = torch.where(y >= 0, y + 0.5, y - 0.5)
    y = torch.clamp(y, -128.0, 127.0).trunc().to(torch.int8)
    return y, scale


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store ``key``/``value`` ``[T, nkv, hs]`` at flat slots ``block * block_size + offset``
    the way vLLM's cache writers do (quantizing per token-head for an INT8 cache)."""
    fmt = kv_format(kv_cache, key.shape[-1])
    hs = fmt.head_size
    slots = slot_mapping.long()
    keep = slots >= 0
    slots, key, value = slots[keep], key[keep], value[keep]
    blk = slots // fmt.block_size
    off = slots % fmt.block_size
    rows = kv_cache[blk, :, off]  # [T, nkv, content] (advanced indexing copies)
    if fmt.is_int8:
        kq, ks = quantize_per_token_head(key)
        vq, vs = quantize_per_token_head(value)
        rows[..., :hs] = kq
        rows[..., hs:hs + 4] = ks.unsqueeze(-1).contiguous().view(torch.int8)
        rows[..., hs + 4:2 * hs + 4] = vq
        rows[..., 2 * hs + 4:] = vs.unsqueeze(-1).contiguous().view(torch.int8)
    else:
        rows[..., :hs] = key.to(kv_cache.dtype)
        rows[..., hs:] = value.to(kv_cache.dtype)
    kv_cache[blk, :, off] = rows
