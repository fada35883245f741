"""Qwen2.5-VL for tallow: a vision-language model plugin (images in, text out)."""

__version__ = "0.1.0"
