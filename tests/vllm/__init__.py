"""Tests that drive the real vLLM engine (CPU build) with the tiny default model."""
