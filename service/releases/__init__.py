"""Releases: every profile's latest runs that carry one label value (`vllm_version=0.25.1`), summed up."""
