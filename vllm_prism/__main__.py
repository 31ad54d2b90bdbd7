"""``python -m vllm_prism`` runs the ``vllm-prism`` command."""

import sys

from vllm_prism.entrypoints.cli import main

sys.exit(main())
