"""The block Hadamard rotation that Bonsai 2 GGUF files fold into their weights.

A folded linear layer stores ``W_st`` and computes ``y = W_st · Hblk(s ⊙ x)``: the
activation is multiplied by a +1/-1 sign vector ``s`` (chosen by the input width) and
then each contiguous ``block``-chunk of it is rotated by the normalized Sylvester
Hadamard matrix ``H`` (symmetric, ``H·H = I``). The token embedding is folded the other
way: after the row lookup ``z`` the hidden state is ``s ⊙ Hblk(z)``.

This module holds

* the math: a fast Walsh-Hadamard butterfly (``O(K log B)``) and the forward, inverse,
  fold and un-fold ("primal") transforms. Every function takes a numpy array or a torch
  tensor (CPU or CUDA, any float dtype) and returns the same kind with the input dtype;
  half-precision inputs are computed in fp32, float64 inputs in float64;
* the contract: the ``prism.hadamard.*`` GGUF metadata that says which tensors are
  folded and with which signs, parsed and checked against the file's tensors, and
  written back for test models.

See ``spec/bonsai2-gguf.md`` section 2. torch is never imported here: tensors are
recognized only when the caller has already imported torch.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from vllm_prism.gguf.constants import GGUFValueType
from vllm_prism.gguf.errors import GGUFError

if TYPE_CHECKING:
    import torch

ArrayT = TypeVar("ArrayT", np.ndarray, "torch.Tensor")

# ---------------------------------------------------------------------------
# Metadata keys and the values this build understands.
# ---------------------------------------------------------------------------

PRISM_KEYS = "prism.hadamard."
KEY_VERSION = PRISM_KEYS + "version"
KEY_BLOCK_SIZE = PRISM_KEYS + "block_size"
KEY_TRANSFORM = PRISM_KEYS + "transform"
KEY_AXIS = PRISM_KEYS + "axis"
KEY_SIGN_MODE = PRISM_KEYS + "sign_mode"
KEY_SIGN_WIDTHS = PRISM_KEYS + "sign_widths"
KEY_SIGN_VALUES = PRISM_KEYS + "sign_values"
KEY_WEIGHT_NAMES = PRISM_KEYS + "weight_names"
KEY_INVERSE_WEIGHT_NAMES = PRISM_KEYS + "inverse_weight_names"
KEY_GDN_V_GROUPED = PRISM_KEYS + "gdn_v_grouped"

SUPPORTED_VERSION = 1
TRANSFORM_NAME = "normalized-sylvester-walsh-hadamard"
AXIS_NAME = "input-last-dimension"
SIGN_MODE_NAME = "explicit"

# ---------------------------------------------------------------------------
# Math
# ---------------------------------------------------------------------------


def _is_power_of_two(n: object) -> bool:
    return (isinstance(n, (int, np.integer)) and not isinstance(n, bool)
            and n > 0 and (int(n) & (int(n) - 1)) == 0)


def _check_block(block: int) -> int:
    if not _is_power_of_two(block):
        raise ValueError(
            f"Hadamard block size must be a positive power of two, got {block!r}")
    return int(block)


def hadamard_matrix(n: int) -> np.ndarray:
    """Normalized Sylvester Hadamard matrix: ``H[r, c] = (-1)**popcount(r & c) / sqrt(n)``.

    Returns a float64 ``[n, n]`` array; ``n`` must be a power of two.
    """
    n = _check_block(n)
    idx = np.arange(n, dtype=np.int64)
    parity = np.zeros((n, n), dtype=np.int64)
    anded = idx[:, None] & idx[None, :]
    while anded.any():
        parity ^= anded & 1
        anded = anded >> 1
    return (1.0 - 2.0 * parity) / math.sqrt(n)


def _is_torch(x: object) -> bool:
    torch_mod = sys.modules.get("torch")
    return torch_mod is not None and isinstance(x, torch_mod.Tensor)


def _to_compute(x: ArrayT) -> tuple[ArrayT, Any]:
    """Return a fresh (never aliasing ``x``) contiguous copy in the compute dtype and the
    dtype to return: float64 stays float64, other floats compute in float32, and
    non-float inputs are promoted to float32."""
    if _is_torch(x):
        torch_mod = sys.modules["torch"]
        out_dtype = x.dtype if x.dtype.is_floating_point else torch_mod.float32
        compute = torch_mod.float64 if x.dtype == torch_mod.float64 else torch_mod.float32
        return x.to(dtype=compute, copy=True).contiguous(), out_dtype
    arr = np.asarray(x)
    is_float = arr.dtype.kind == "f"
    out_dtype = arr.dtype if is_float else np.dtype(np.float32)
    compute = np.float64 if is_float and arr.dtype.itemsize >= 8 else np.float32
    return np.array(arr, dtype=compute, order="C", copy=True), out_dtype


def _from_compute(y: ArrayT, out_dtype: Any) -> ArrayT:
    if _is_torch(y):
        return y if y.dtype == out_dtype else y.to(out_dtype)
    return y if y.dtype == out_dtype else y.astype(out_dtype)


def _check_width(x: ArrayT, block: int) -> int:
    if x.ndim == 0:
        raise ValueError("Hadamard transform needs at least one dimension, got a scalar")
    width = int(x.shape[-1])
    if width % block != 0:
        raise ValueError(
            f"last dimension {width} is not a multiple of the Hadamard block size {block}")
    return width


def _signs_like(signs: Any, y: ArrayT, width: int) -> ArrayT:
    """The sign vector as the kind, dtype and device of ``y`` (the compute buffer)."""
    if _is_torch(y):
        torch_mod = sys.modules["torch"]
        s = torch_mod.as_tensor(signs).to(device=y.device, dtype=y.dtype)
    else:
        if _is_torch(signs):
            signs = signs.detach().cpu().numpy()
        s = np.asarray(signs, dtype=y.dtype)
    if tuple(s.shape) != (width,):
        raise ValueError(
            f"sign vector has shape {tuple(s.shape)}, expected ({width},) to match the "
            "last dimension of the input")
    return s


def _fwht_(y: ArrayT, block: int) -> ArrayT:
    """In place: normalized Walsh-Hadamard butterfly on each ``block``-chunk of the
    last dim of the contiguous compute buffer ``y``. Returns ``y``."""
    width = int(y.shape[-1])
    rows = math.prod(int(d) for d in y.shape[:-1])
    chunks = rows * (width // block)
    if chunks == 0 or block == 1:
        return y
    h = 1
    while h < block:
        # pairs (i, i + h) inside each run of 2h elements: a <- a + b, b <- a - b
        view = y.reshape(chunks, block // (2 * h), 2, h)
        a = view[:, :, 0, :]
        b = view[:, :, 1, :]
        diff = a - b
        a += b
        b[...] = diff
        h *= 2
    y *= 1.0 / math.sqrt(block)
    return y


def block_hadamard(x: ArrayT, block: int) -> ArrayT:
    """Apply ``H`` (size ``block``) to each contiguous ``block``-chunk of the last dim."""
    block = _check_block(block)
    y, out_dtype = _to_compute(x)
    _check_width(y, block)
    return _from_compute(_fwht_(y, block), out_dtype)


def _signs_then_hadamard(x: ArrayT, signs: Any, block: int) -> ArrayT:
    """``Hblk(s ⊙ x)`` along the last dim."""
    block = _check_block(block)
    y, out_dtype = _to_compute(x)
    width = _check_width(y, block)
    y *= _signs_like(signs, y, width)
    return _from_compute(_fwht_(y, block), out_dtype)


def _hadamard_then_signs(x: ArrayT, signs: Any, block: int) -> ArrayT:
    """``s ⊙ Hblk(x)`` along the last dim."""
    block = _check_block(block)
    y, out_dtype = _to_compute(x)
    width = _check_width(y, block)
    s = _signs_like(signs, y, width)
    y = _fwht_(y, block)
    y *= s
    return _from_compute(y, out_dtype)


def forward_transform(x: ArrayT, signs: Any, block: int) -> ArrayT:
    """Activation transform of a folded linear layer: ``Hblk(s ⊙ x)``.

    ``y = W_st @ forward_transform(x)`` equals the un-folded layer's output.
    """
    return _signs_then_hadamard(x, signs, block)


def inverse_embedding_transform(z: ArrayT, signs: Any, block: int) -> ArrayT:
    """Hidden state from a folded embedding row ``z``: ``s ⊙ Hblk(z)``."""
    return _hadamard_then_signs(z, signs, block)


def primal_weight(w_st: ArrayT, signs: Any, block: int) -> ArrayT:
    """Un-folded weight, per row ``s ⊙ Hblk(w_st_row)``, so that
    ``primal_weight(W_st) @ x == W_st @ forward_transform(x)``.

    The result is no longer ternary: use it for references, not for the fast path.
    """
    return _hadamard_then_signs(w_st, signs, block)


def fold_weight(w: ArrayT, signs: Any, block: int) -> ArrayT:
    """Fold a primal weight, per row ``Hblk(s ⊙ w)``: the inverse of ``primal_weight``."""
    return _signs_then_hadamard(w, signs, block)


def primal_embedding(z_st: ArrayT, signs: Any, block: int) -> ArrayT:
    """Rows of the un-folded embedding table: ``s ⊙ Hblk(z)`` per row."""
    return _hadamard_then_signs(z_st, signs, block)


def fold_embedding(e: ArrayT, signs: Any, block: int) -> ArrayT:
    """Fold an embedding table, per row ``Hblk(s ⊙ e)``: the inverse of
    ``primal_embedding``."""
    return _signs_then_hadamard(e, signs, block)


# ---------------------------------------------------------------------------
# Contract
# ---------------------------------------------------------------------------

MetadataEntry = tuple[str, object, GGUFValueType, "GGUFValueType | None"]


@dataclass(frozen=True, eq=False)
class HadamardContract:
    """What the ``prism.hadamard.*`` metadata of a file says, checked.

    ``signs`` maps each input width to a read-only float32 vector of +1/-1.
    ``weight_names`` are forward-folded tensors (apply ``forward_transform`` to their
    input); ``inverse_weight_names`` are embedding tables (apply
    ``inverse_embedding_transform`` after the lookup). ``path`` only feeds messages.
    """

    version: int
    block_size: int
    transform: str
    axis: str
    sign_mode: str
    sign_widths: tuple[int, ...]
    signs: dict[int, np.ndarray]
    weight_names: frozenset[str]
    inverse_weight_names: frozenset[str]
    gdn_v_grouped: bool
    path: str | None = field(default=None, repr=False)

    def signs_for(self, width: int) -> np.ndarray:
        """The sign vector of input width ``width``; GGUFError when there is none."""
        try:
            return self.signs[int(width)]
        except KeyError:
            raise GGUFError(
                f"{KEY_SIGN_WIDTHS} has no sign vector for input width {width}; "
                f"widths with one: {list(self.sign_widths)}", self.path) from None

    def is_folded(self, name: str) -> bool:
        """Whether GGUF tensor ``name`` is forward-folded (transform its input)."""
        return name in self.weight_names

    def is_inverse_folded(self, name: str) -> bool:
        """Whether GGUF tensor ``name`` is an inverse-folded embedding table."""
        return name in self.inverse_weight_names

    def to_metadata(self) -> list[MetadataEntry]:
        """``(key, value, value type, element type)`` entries for a GGUF writer."""
        sign_values = np.concatenate(
            [self.signs[w] for w in self.sign_widths]
            or [np.zeros(0, np.float32)]).astype(np.int64)
        return [
            (KEY_VERSION, int(self.version), GGUFValueType.UINT32, None),
            (KEY_BLOCK_SIZE, int(self.block_size), GGUFValueType.UINT32, None),
            (KEY_TRANSFORM, self.transform, GGUFValueType.STRING, None),
            (KEY_AXIS, self.axis, GGUFValueType.STRING, None),
            (KEY_SIGN_MODE, self.sign_mode, GGUFValueType.STRING, None),
            (KEY_SIGN_WIDTHS, [int(w) for w in self.sign_widths],
             GGUFValueType.ARRAY, GGUFValueType.UINT32),
            (KEY_SIGN_VALUES, sign_values.tolist(),
             GGUFValueType.ARRAY, GGUFValueType.INT8),
            (KEY_WEIGHT_NAMES, sorted(self.weight_names),
             GGUFValueType.ARRAY, GGUFValueType.STRING),
            (KEY_INVERSE_WEIGHT_NAMES, sorted(self.inverse_weight_names),
             GGUFValueType.ARRAY, GGUFValueType.STRING),
            (KEY_GDN_V_GROUPED, bool(self.gdn_v_grouped), GGUFValueType.BOOL, None),
        ]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HadamardContract):
            return NotImplemented
        return (self._key() == other._key()
                and self.signs.keys() == other.signs.keys()
                and all(np.array_equal(v, other.signs[w]) for w, v in self.signs.items()))

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple:
        return (self.version, self.block_size, self.transform, self.axis, self.sign_mode,
                self.sign_widths, self.weight_names, self.inverse_weight_names,
                self.gdn_v_grouped)


# --- metadata value coercion -------------------------------------------------


def _fail(path: str | None, key: str, problem: str, expected: str) -> GGUFError:
    return GGUFError(f"{key}: {problem}; expected {expected}", path)


def _unwrap(value: Any) -> Any:
    """numpy scalars and one-element arrays -> python scalars."""
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind != "U":
        return value.reshape(()).item()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _get_int(md: Mapping[str, Any], key: str, path: str | None) -> int:
    value = _unwrap(md[key])
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, key, f"value {value!r} is not an integer", "an unsigned integer")
    return value


def _as_str(value: Any) -> str | None:
    value = _unwrap(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _get_str(md: Mapping[str, Any], key: str, path: str | None, expected: str) -> str:
    text = _as_str(md[key])
    if text is None:
        raise _fail(path, key, f"value {md[key]!r} is not a string", f"{expected!r}")
    if text != expected:
        raise _fail(path, key, f"unsupported value {text!r}", f"{expected!r}")
    return text


def _get_bool(md: Mapping[str, Any], key: str, path: str | None) -> bool:
    value = _unwrap(md[key])
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise _fail(path, key, f"value {value!r} is not a boolean", "true or false")


def _get_int_array(md: Mapping[str, Any], key: str, path: str | None) -> np.ndarray:
    raw = md[key]
    if isinstance(raw, (str, bytes)) or not isinstance(raw, (Sequence, np.ndarray)):
        raise _fail(path, key, f"value of type {type(raw).__name__} is not an array",
                    "an array of integers")
    arr = np.asarray(raw)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise _fail(path, key, f"value is not a flat array of integers (dtype {arr.dtype})",
                    "an array of integers")
    return arr.astype(np.int64)


def _get_names(md: Mapping[str, Any], key: str, path: str | None) -> list[str]:
    raw = md[key]
    if isinstance(raw, (str, bytes)) or not isinstance(raw, (Iterable, np.ndarray)):
        raise _fail(path, key, f"value of type {type(raw).__name__} is not an array",
                    "an array of tensor names")
    names: list[str] = []
    for i, item in enumerate(raw):
        name = _as_str(item)
        if not name:
            raise _fail(path, key, f"element {i} ({item!r}) is not a tensor name",
                        "an array of non-empty strings")
        names.append(name)
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise _fail(path, key, f"tensor {name!r} is listed twice",
                        "each tensor named once")
        seen.add(name)
    return names


# --- parsing ------------------------------------------------------------------

_REQUIRED_KEYS = (KEY_VERSION, KEY_BLOCK_SIZE, KEY_TRANSFORM, KEY_AXIS, KEY_SIGN_MODE,
                  KEY_SIGN_WIDTHS, KEY_SIGN_VALUES, KEY_WEIGHT_NAMES,
                  KEY_INVERSE_WEIGHT_NAMES, KEY_GDN_V_GROUPED)


def _parse_signs(md: Mapping[str, Any], block: int,
                 path: str | None) -> tuple[tuple[int, ...], dict[int, np.ndarray]]:
    widths = _get_int_array(md, KEY_SIGN_WIDTHS, path)
    if widths.size == 0:
        raise _fail(path, KEY_SIGN_WIDTHS, "the array is empty",
                    "one input width per sign vector")
    seen: set[int] = set()
    for w in widths.tolist():
        if w <= 0:
            raise _fail(path, KEY_SIGN_WIDTHS, f"width {w} is not positive",
                        "positive input widths")
        if w in seen:
            raise _fail(path, KEY_SIGN_WIDTHS, f"width {w} appears twice",
                        "one sign vector per distinct width")
        if w % block != 0:
            raise _fail(path, KEY_SIGN_WIDTHS,
                        f"width {w} is not a multiple of {KEY_BLOCK_SIZE} = {block}",
                        f"widths that are multiples of {block}")
        seen.add(w)
    values = _get_int_array(md, KEY_SIGN_VALUES, path)
    total = int(widths.sum())
    if values.size != total:
        raise _fail(path, KEY_SIGN_VALUES,
                    f"holds {values.size} values but {KEY_SIGN_WIDTHS} "
                    f"{widths.tolist()} sum to {total}",
                    f"{total} values (one vector per width, concatenated)")
    bad = np.flatnonzero((values != 1) & (values != -1))
    if bad.size:
        i = int(bad[0])
        raise _fail(path, KEY_SIGN_VALUES,
                    f"value {int(values[i])} at index {i} is not a sign",
                    "only +1 and -1")
    signs: dict[int, np.ndarray] = {}
    offset = 0
    for w in widths.tolist():
        vec = values[offset:offset + w].astype(np.float32)
        vec.setflags(write=False)
        signs[w] = vec
        offset += w
    return tuple(widths.tolist()), signs


def _check_names(key: str, names: Sequence[str], tensor_widths: Mapping[str, int],
                 block: int, signs: Mapping[int, np.ndarray], path: str | None) -> None:
    for name in names:
        if name not in tensor_widths:
            raise _fail(path, key, f"tensor {name!r} does not exist in the file",
                        "names of tensors in the file")
        width = int(tensor_widths[name])
        if width % block != 0:
            raise _fail(path, key,
                        f"tensor {name!r} has input width {width}, not a multiple of "
                        f"{KEY_BLOCK_SIZE} = {block}",
                        f"input widths that are multiples of {block}")
        if width not in signs:
            raise _fail(path, key,
                        f"tensor {name!r} has input width {width} but {KEY_SIGN_WIDTHS} "
                        f"has no vector for it",
                        f"one of the widths {sorted(signs)}")


def parse_hadamard_contract(metadata: Mapping[str, Any],
                            tensor_widths: Mapping[str, int],
                            path: str | None = None) -> HadamardContract | None:
    """Read and check the ``prism.hadamard.*`` keys of a GGUF file.

    ``tensor_widths`` maps every tensor name of the file to its input width (ne[0]).
    Returns None when the file has no such key (legacy files, served without a
    transform); raises GGUFError naming the key and the problem for anything else
    this build does not understand.
    """
    if not any(isinstance(k, str) and k.startswith(PRISM_KEYS) for k in metadata):
        return None
    for key in _REQUIRED_KEYS:
        if key not in metadata:
            raise _fail(path, key, "the key is missing",
                        f"all of {list(_REQUIRED_KEYS)} in a file with {PRISM_KEYS}* keys")
    version = _get_int(metadata, KEY_VERSION, path)
    if version != SUPPORTED_VERSION:
        raise _fail(path, KEY_VERSION, f"unsupported version {version}",
                    f"version {SUPPORTED_VERSION}")
    block = _get_int(metadata, KEY_BLOCK_SIZE, path)
    if not _is_power_of_two(block):
        raise _fail(path, KEY_BLOCK_SIZE, f"{block} is not a power of two",
                    "a positive power of two such as 1024")
    transform = _get_str(metadata, KEY_TRANSFORM, path, TRANSFORM_NAME)
    axis = _get_str(metadata, KEY_AXIS, path, AXIS_NAME)
    sign_mode = _get_str(metadata, KEY_SIGN_MODE, path, SIGN_MODE_NAME)
    sign_widths, signs = _parse_signs(metadata, block, path)
    forward = _get_names(metadata, KEY_WEIGHT_NAMES, path)
    inverse = _get_names(metadata, KEY_INVERSE_WEIGHT_NAMES, path)
    both = sorted(set(forward) & set(inverse))
    if both:
        raise _fail(path, KEY_INVERSE_WEIGHT_NAMES,
                    f"tensor {both[0]!r} is also in {KEY_WEIGHT_NAMES}",
                    "each tensor folded one way only")
    _check_names(KEY_WEIGHT_NAMES, forward, tensor_widths, block, signs, path)
    _check_names(KEY_INVERSE_WEIGHT_NAMES, inverse, tensor_widths, block, signs, path)
    return HadamardContract(
        version=version, block_size=block, transform=transform, axis=axis,
        sign_mode=sign_mode, sign_widths=sign_widths, signs=signs,
        weight_names=frozenset(forward), inverse_weight_names=frozenset(inverse),
        gdn_v_grouped=_get_bool(metadata, KEY_GDN_V_GROUPED, path), path=path)


def make_contract(widths: Sequence[int], block_size: int, weight_names: Iterable[str],
                  inverse_weight_names: Iterable[str], *, seed: int,
                  gdn_v_grouped: bool = True) -> HadamardContract:
    """A contract with deterministic random signs (``np.random.default_rng(seed)``),
    for tiny test models. Tensor names are not checked against any file."""
    block = _check_block(block_size)
    widths = tuple(int(w) for w in widths)
    if not widths or len(set(widths)) != len(widths):
        raise ValueError(f"widths must be non-empty and distinct, got {list(widths)}")
    for w in widths:
        if w <= 0 or w % block != 0:
            raise ValueError(f"width {w} is not a positive multiple of block size {block}")
    forward, inverse = frozenset(weight_names), frozenset(inverse_weight_names)
    if forward & inverse:
        raise ValueError(f"tensors folded both ways: {sorted(forward & inverse)}")
    rng = np.random.default_rng(seed)
    signs: dict[int, np.ndarray] = {}
    for w in widths:
        vec = np.where(rng.integers(0, 2, size=w) == 0, -1.0, 1.0).astype(np.float32)
        vec.setflags(write=False)
        signs[w] = vec
    return HadamardContract(
        version=SUPPORTED_VERSION, block_size=block, transform=TRANSFORM_NAME,
        axis=AXIS_NAME, sign_mode=SIGN_MODE_NAME, sign_widths=widths, signs=signs,
        weight_names=forward, inverse_weight_names=inverse,
        gdn_v_grouped=bool(gdn_v_grouped))
