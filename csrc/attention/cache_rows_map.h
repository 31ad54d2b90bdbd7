// A TMA tensor map over a paged cache's slot rows, host side: the encoder from the driver (no
// link to libcuda) and the map's geometry. The warpgroup verification kernel's producer
// (int8_verify_wgmma.cu) copies its stages through it, and so does the copy-pattern probe
// (benchmarks/kernels/kv_copy_probe.cu).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace vllm_prism {

// cuTensorMapEncodeTiled from the driver, nullptr where it has none; looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
#if CUDART_VERSION < 12050
  return nullptr;
#else
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                         cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encoder;
#endif
}

// The cache as 8-byte elements: dimension 0 a slot's bytes (slot_bytes / 8 elements, every KV
// head side by side), 1 a block's slots, 2 the blocks (block_bytes apart); boxes of `box0`
// elements x `box_slots` slots x 1 block, without swizzle, read past dimension 0 as zeros.
// True where the map was made.
inline bool encode_cache_rows_map(CUtensorMap* map, const void* cache, int64_t slot_bytes,
                                  int64_t block_size, int64_t num_blocks, int64_t block_bytes,
                                  uint32_t box0, uint32_t box_slots) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(slot_bytes / 8),
                              static_cast<cuuint64_t>(block_size),
                              static_cast<cuuint64_t>(num_blocks)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(slot_bytes),
                                 static_cast<cuuint64_t>(block_bytes)};
  const cuuint32_t box[3] = {box0, box_slots, 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT64, 3, const_cast<void*>(cache), dims, strides,
                box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace vllm_prism
