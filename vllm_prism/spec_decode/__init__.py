"""Speculative decoding support for Bonsai GGUF targets (DFlash drafters)."""
