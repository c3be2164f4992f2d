"""wansim: speculative decoding over WAN pipeline-parallel LLM inference."""
