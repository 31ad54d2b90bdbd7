"""Attention for Bonsai: kernels over vLLM's KV cache (ops/) and the backend that wraps them."""
