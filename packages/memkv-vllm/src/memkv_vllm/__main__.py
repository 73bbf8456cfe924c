"""`python -m memkv_vllm doctor ...`: the package's commands (`doctor`: check this host
before a vLLM server with memkv-vllm starts)."""

from __future__ import annotations

import sys

from .doctor import main

if __name__ == "__main__":
    if sys.argv[1:2] != ["doctor"]:
        sys.exit("usage: python -m memkv_vllm doctor [--help]")
    sys.exit(main(sys.argv[2:]))
