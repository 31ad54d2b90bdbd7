"""Check a Bonsai GGUF file against what vllm-prism can serve, and summarise it.

:func:`inspect_gguf` opens the file, reads the architecture, the tensor types, the Hadamard
contract and the tokenizer, and lists every problem that would stop the file from being
served. ``vllm-prism inspect`` prints the report; the GGUF loader uses
:func:`find_problems` to refuse a bad file before the engine starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from vllm_prism.gguf.constants import FLOAT_TYPES, GGMLType, Q2_0_G64_LAYOUT
from vllm_prism.gguf.errors import GGUFError
from vllm_prism.gguf.hadamard import HadamardContract, parse_hadamard_contract
from vllm_prism.gguf.qwen35 import (ARCH, Qwen35Dims, expected_tensors, qwen35_dims,
                                    qwen35_text_config)
from vllm_prism.gguf.reader import GGUFReader
from vllm_prism.gguf.tokenizer import (GGUFTokenizerData, build_tokenizer,
                                       chat_template_problem, read_tokenizer_data)

# Tensor types vllm-prism can serve a ternary projection from.
SERVABLE_TERNARY = frozenset({GGMLType.PQ2_0, GGMLType.PTQ1_0, GGMLType.Q2_0})
# Leaves (GGUF name after "blk.N.") of the projections that may be ternary.
TERNARY_LEAVES = frozenset({
    "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "attn_qkv.weight", "attn_gate.weight", "ssm_out.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"})
TERNARY_GLOBALS = frozenset({"token_embd.weight", "output.weight"})


def may_be_ternary(name: str) -> bool:
    """Whether the model can take tensor ``name`` in a ternary type (else it needs float)."""
    if name in TERNARY_GLOBALS:
        return True
    parts = name.split(".", 2)
    return len(parts) == 3 and parts[0] == "blk" and parts[2] in TERNARY_LEAVES


def type_label(reader: GGUFReader, name: str) -> str:
    """Tensor type name, telling the two Q2_0 group sizes apart."""
    info = reader.tensors[name]
    if info.ggml_type == GGMLType.Q2_0:
        return "Q2_0/g64" if info.layout == Q2_0_G64_LAYOUT else "Q2_0/g128"
    return info.ggml_type.name


@dataclass
class TypeRow:
    """One line of the tensor-type histogram."""

    tensors: int = 0
    elements: int = 0
    nbytes: int = 0


@dataclass
class InspectReport:
    """What `vllm-prism inspect` shows about a file."""

    path: str
    file_size: int
    version: int
    alignment: int
    architecture: str | None
    name: str | None
    dims: Qwen35Dims | None = None
    types: dict[str, TypeRow] = field(default_factory=dict)
    contract: HadamardContract | None = None
    tokenizer: GGUFTokenizerData | None = None
    # Why the file's own tokenizer cannot be used (None: it can); a problem only where no
    # other tokenizer is given (``--tokenizer``, ``skip_tokenizer_init``).
    tokenizer_problem: str | None = None
    problems: list[str] = field(default_factory=list)
    # Served anyway, with less: a chat template that does not compile (completions only).
    warnings: list[str] = field(default_factory=list)


def _type_histogram(reader: GGUFReader) -> dict[str, TypeRow]:
    rows: dict[str, TypeRow] = {}
    for name, info in reader.tensors.items():
        row = rows.setdefault(type_label(reader, name), TypeRow())
        row.tensors += 1
        row.elements += info.n_elements
        row.nbytes += info.nbytes
    return dict(sorted(rows.items(), key=lambda kv: -kv[1].nbytes))


def _count_problems(reader: GGUFReader, dims: Qwen35Dims) -> list[str]:
    """Counts the header states, against the tensor table, before anything is built from
    them (a per-layer list of 3 million layers would take gigabytes)."""
    # every qwen35 layer has at least its two norms, three MLP and four mixer tensors
    per_layer = 9
    have = len(reader.tensors)
    if dims.n_layers * per_layer > have:
        return [f"metadata key 'qwen35.block_count' says {dims.n_layers + dims.n_mtp_layers} "
                f"layers, but the file has only {have} tensors (a {dims.n_layers}-layer qwen35 "
                f"model has at least {dims.n_layers * per_layer})"]
    return []


def _tensor_problems(reader: GGUFReader, dims: Qwen35Dims) -> list[str]:
    problems = []
    expected = expected_tensors(dims)
    for name, shape in expected.items():
        info = reader.tensors.get(name)
        if info is None:
            problems.append(f"tensor {name} is missing (expected shape {list(shape)})")
            continue
        if info.shape != shape:
            problems.append(f"tensor {name} has shape {list(info.shape)}, "
                            f"expected {list(shape)}")
        t = info.ggml_type
        if may_be_ternary(name):
            if t not in SERVABLE_TERNARY and t not in FLOAT_TYPES:
                problems.append(f"tensor {name} has type {t.name}, which vllm-prism cannot "
                                f"serve (use PQ2_0, PTQ1_0, Q2_0, F32, F16 or BF16)")
        elif t not in FLOAT_TYPES:
            problems.append(f"tensor {name} has type {t.name} but the model needs it in float "
                            "(F32, F16 or BF16)")
    for name in reader.tensors:
        if name not in expected:
            problems.append(f"tensor {name} is not part of a {dims.n_layers}-layer qwen35 "
                            "model (unexpected extra tensor)")
    return problems


def _legacy_layout_problems(reader: GGUFReader, dims: Qwen35Dims) -> list[str]:
    """A file without the contract has ssm_out's input columns in llama.cpp's tiled order;
    the loader puts them back on the packed rows, one value head per whole block."""
    problems = []
    for name, info in reader.tensors.items():
        if not name.endswith(".ssm_out.weight") or info.ggml_type in FLOAT_TYPES:
            continue
        block = info.layout.block_size
        if dims.head_v_dim % block:
            problems.append(f"tensor {name}: without a prism.hadamard contract its value-head "
                            f"columns are in llama.cpp's tiled order, and heads of "
                            f"{dims.head_v_dim} columns do not span whole {block}-element "
                            f"{info.ggml_type.name} blocks, so they cannot be put back; "
                            "convert the file again with a Prism contract")
            break
    return problems


def _contract_problems(contract: HadamardContract | None, reader: GGUFReader) -> list[str]:
    if contract is None:
        return []
    problems = []
    for name in sorted(contract.weight_names | contract.inverse_weight_names):
        if not may_be_ternary(name):
            problems.append(f"prism.hadamard names tensor {name}, which is not a projection "
                            "that can be folded")
    for name in sorted(contract.inverse_weight_names - {"token_embd.weight"}):
        problems.append(f"prism.hadamard.inverse_weight_names lists {name}; only "
                        "token_embd.weight can be inverse-folded")
    if not contract.gdn_v_grouped:
        folded_out = [n for n in contract.weight_names if n.endswith(".ssm_out.weight")]
        if folded_out:
            problems.append("prism.hadamard.gdn_v_grouped is false but ssm_out is folded: its "
                            "tiled columns cannot be reordered through the rotation")
    del reader
    return problems


def _tokenizer_build_problem(data: GGUFTokenizerData) -> str | None:
    """Why the tokenizers library cannot build the file's tokenizer (None: it can)."""
    try:
        build_tokenizer(data)
    except GGUFError as e:
        return e.reason
    return None


def find_problems(reader: GGUFReader, *, own_tokenizer: bool = True,
                  build: bool = True) -> tuple[InspectReport, list[str]]:
    """Inspect an open file; the report and its list of problems (empty: servable).

    Runs every check serving runs before the engine starts: the metadata, the text config,
    the tensors, the Hadamard contract, the tokenizer (built with ``build``; serving builds
    it once when it writes the tokenizer folder) and the chat template (a warning).
    ``own_tokenizer=False``: a tokenizer comes from elsewhere, so the file needs none."""
    md = reader.metadata
    report = InspectReport(
        path=reader.path, file_size=reader.file_size, version=reader.version,
        alignment=reader.alignment, architecture=md.get("general.architecture"),
        name=md.get("general.name"))
    report.types = _type_histogram(reader)
    problems = report.problems
    if report.architecture != ARCH:
        problems.append(f"architecture {report.architecture!r} is not supported; vllm-prism "
                        f"serves {ARCH} (Bonsai) files")
        return report, problems
    try:
        report.tokenizer = read_tokenizer_data(md, reader.path)
        report.tokenizer_problem = _tokenizer_build_problem(report.tokenizer) if build \
            else None
    except GGUFError as e:
        report.tokenizer_problem = e.reason
    if report.tokenizer_problem is not None and own_tokenizer:
        problems.append(report.tokenizer_problem)
    if report.tokenizer is not None and own_tokenizer:
        template = chat_template_problem(report.tokenizer.chat_template)
        if template:
            report.warnings.append(f"{template}; completions are served, chat requests are "
                                   "refused")
    vocab = len(report.tokenizer.tokens) if report.tokenizer else None
    if "token_embd.weight" in reader.tensors:
        vocab = reader.tensors["token_embd.weight"].shape[0]
    try:
        report.dims = qwen35_dims(md, reader.path, vocab_size=vocab)
    except GGUFError as e:
        problems.append(e.reason)
        return report, problems
    counts = _count_problems(reader, report.dims)
    if counts:  # nothing is built from counts the file cannot hold
        problems.extend(counts)
        return report, problems
    try:
        qwen35_text_config(md, reader.path, vocab_size=vocab)  # what serving builds
    except GGUFError as e:
        problems.append(e.reason)
    widths = {n: i.ne[0] for n, i in reader.tensors.items()}
    try:
        report.contract = parse_hadamard_contract(md, widths, reader.path)
    except GGUFError as e:
        problems.append(e.reason)
    problems.extend(_tensor_problems(reader, report.dims))
    problems.extend(_contract_problems(report.contract, reader))
    if report.contract is None:
        problems.extend(_legacy_layout_problems(reader, report.dims))
    return report, problems


def inspect_gguf(path: str | os.PathLike) -> InspectReport:
    """Open and inspect ``path`` (GGUFError if the file itself cannot be read)."""
    with GGUFReader(path) as reader:
        report, _ = find_problems(reader)
    return report


def format_report(report: InspectReport) -> str:
    """The human-readable text `vllm-prism inspect` prints."""
    lines = [f"file: {report.path} ({report.file_size:,} bytes, GGUF v{report.version}, "
             f"alignment {report.alignment})",
             f"architecture: {report.architecture}" + (f" ({report.name})" if report.name else "")]
    if report.dims is not None:
        lines += _format_dims(report.dims)
    lines.append("tensor types:")
    lines.append(f"  {'type':<10} {'tensors':>7} {'elements':>14} {'bytes':>14}")
    total = TypeRow()
    for label, row in report.types.items():
        lines.append(f"  {label:<10} {row.tensors:>7} {row.elements:>14,} {row.nbytes:>14,}")
        total.tensors += row.tensors
        total.elements += row.elements
        total.nbytes += row.nbytes
    lines.append(f"  {'total':<10} {total.tensors:>7} {total.elements:>14,} {total.nbytes:>14,}")
    lines += _format_contract(report.contract)
    if report.tokenizer is not None:
        t = report.tokenizer
        specials = ", ".join(f"{k} {t.tokens[v]!r} ({v})" for k, v in t.special_ids.items())
        lines.append(f"tokenizer: byte-level BPE ({t.pre}), {len(t.tokens)} tokens, "
                     f"{len(t.merges)} merges; {specials or 'no special ids'}; chat template: "
                     f"{'yes' if t.chat_template else 'no'}")
    lines += [f"warning: {w}" for w in report.warnings]
    if report.problems:
        lines.append(f"problems ({len(report.problems)}):")
        lines += [f"  - {p}" for p in capped(report.problems)]
    else:
        lines.append("problems: none")
    return "\n".join(lines)


MAX_LISTED_PROBLEMS = 20


def capped(problems: list[str], limit: int = MAX_LISTED_PROBLEMS) -> list[str]:
    """The first ``limit`` problems, then one line counting the rest."""
    if len(problems) <= limit:
        return list(problems)
    return [*problems[:limit], f"and {len(problems) - limit} more"]


def _format_dims(d: Qwen35Dims) -> list[str]:
    full = [i for i in range(d.n_layers) if d.is_full_attention(i)]
    return [
        "hyperparameters:",
        f"  layers {d.n_layers}: {d.n_layers - len(full)} Gated DeltaNet, {len(full)} full "
        f"attention (every {d.full_attention_interval}th: {full})",
        f"  hidden {d.hidden}, intermediate {d.intermediate}, vocab {d.vocab_size}",
        f"  full attention: {d.n_heads} query / {d.n_kv_heads} KV heads, head dim {d.head_dim},"
        " gated output",
        f"  Gated DeltaNet: {d.n_k_heads} key / {d.n_v_heads} value heads, head dims "
        f"{d.head_k_dim}/{d.head_v_dim}, conv kernel {d.conv_kernel}",
    ]


def _format_contract(c: HadamardContract | None) -> list[str]:
    if c is None:
        return ["hadamard: none (weights are served as stored, with no transform)"]
    return [f"hadamard: {c.transform}, block {c.block_size}, sign widths "
            f"{list(c.sign_widths)}, {len(c.weight_names)} forward-folded, "
            f"{len(c.inverse_weight_names)} inverse-folded "
            f"({', '.join(sorted(c.inverse_weight_names))}), gdn_v_grouped "
            f"{str(c.gdn_v_grouped).lower()}"]


__all__ = ["InspectReport", "find_problems", "inspect_gguf", "format_report", "may_be_ternary"]


def ternary_kinds(reader: GGUFReader) -> set[tuple[GGMLType, int]]:
    """The (block type, group) pairs of the file's non-float projections."""
    return {(i.ggml_type, i.layout.block_size) for n, i in reader.tensors.items()
            if may_be_ternary(n) and i.ggml_type not in FLOAT_TYPES}


def format_kinds(kinds: set[tuple[GGMLType, int]]) -> str:
    return ", ".join(sorted(f"{t.name}/g{g}" for t, g in kinds)) or "none"


def find_serving_problems(reader: GGUFReader, *, own_tokenizer: bool = True,
                          build: bool = True) -> list[str]:
    """Everything that stops vllm-prism from serving the open file (empty: servable);
    ``own_tokenizer=False`` when the tokenizer comes from elsewhere."""
    return check_serving(reader, own_tokenizer=own_tokenizer, build=build)[1]


def check_serving(reader: GGUFReader, *, own_tokenizer: bool = True,
                  build: bool = True) -> tuple[InspectReport, list[str]]:
    """:func:`find_problems` plus what only serving needs; the report and the problems."""
    report, problems = find_problems(reader, own_tokenizer=own_tokenizer, build=build)
    if problems:
        return report, problems
    ternary = {n: i for n, i in reader.tensors.items() if may_be_ternary(n)}
    floats = sorted(n for n, i in ternary.items() if i.ggml_type in FLOAT_TYPES)
    if floats:
        problems.append(f"projection {floats[0]} (and {len(floats) - 1} more) is stored in "
                        f"float; vllm-prism serves ternary projections (PQ2_0, PTQ1_0, Q2_0)")
    kinds = ternary_kinds(reader)
    if len(kinds) > 1:
        problems.append(f"the projections mix ternary types ({format_kinds(kinds)}); "
                        "vllm-prism serves one type per file")
    contract = report.contract
    if contract is not None:
        want = set(ternary) - {"token_embd.weight"}
        unfolded = sorted(want - contract.weight_names)
        if unfolded:
            problems.append(f"the Hadamard contract does not fold {unfolded[0]} (and "
                            f"{len(unfolded) - 1} more); vllm-prism needs every projection "
                            "folded when the file has a contract")
        if "token_embd.weight" not in contract.inverse_weight_names:
            problems.append("the Hadamard contract does not inverse-fold token_embd.weight")
    return report, problems
