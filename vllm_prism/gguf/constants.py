"""GGUF constants: magic, versions, metadata value types and the ggml tensor types we know.

Only the tensor types that occur in Bonsai files (and their close relatives) are listed;
a file with any other type is refused by the reader with the type's id in the message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

GGUF_MAGIC = b"GGUF"
GGUF_SUPPORTED_VERSIONS = (2, 3)
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_ALIGNMENT_KEY = "general.alignment"


class GGUFValueType(enum.IntEnum):
    """Metadata value types of the GGUF key/value section."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


class GGMLType(enum.IntEnum):
    """ggml tensor type ids understood by vllm-prism."""

    F32 = 0
    F16 = 1
    Q8_0 = 8
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    Q1_0 = 41
    Q2_0 = 42  # group 128 (legacy Prism, 34 B) or group 64 (mainline, 18 B): told by size
    PQ2_0 = 142
    PTQ1_0 = 143


@dataclass(frozen=True)
class BlockLayout:
    """Elements per block and bytes per block of a ggml tensor type."""

    block_size: int
    type_size: int


# Q2_0 has two layouts; GGML_BLOCK_LAYOUTS holds the legacy Prism one (group 128) and
# Q2_0_G64_LAYOUT the mainline one. The reader tells them apart by the tensor's byte size.
GGML_BLOCK_LAYOUTS: dict[GGMLType, BlockLayout] = {
    GGMLType.F32: BlockLayout(1, 4),
    GGMLType.F16: BlockLayout(1, 2),
    GGMLType.BF16: BlockLayout(1, 2),
    GGMLType.Q8_0: BlockLayout(32, 34),
    GGMLType.TQ1_0: BlockLayout(256, 54),
    GGMLType.TQ2_0: BlockLayout(256, 66),
    GGMLType.Q1_0: BlockLayout(128, 18),
    GGMLType.Q2_0: BlockLayout(128, 34),
    GGMLType.PQ2_0: BlockLayout(128, 34),
    GGMLType.PTQ1_0: BlockLayout(128, 28),
}
Q2_0_G64_LAYOUT = BlockLayout(64, 18)

# Types whose weights are ternary (or binary) codes with one fp16 scale per block.
TERNARY_TYPES = frozenset(
    {GGMLType.PQ2_0, GGMLType.PTQ1_0, GGMLType.Q2_0, GGMLType.Q1_0,
     GGMLType.TQ1_0, GGMLType.TQ2_0})
FLOAT_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16})
