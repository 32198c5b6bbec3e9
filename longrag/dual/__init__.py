"""Dual-perspective LongRAG ("LongRAG: A Dual-Perspective Retrieval-Augmented Generation Paradigm for
Long-Context Question Answering", Zhao et al., EMNLP 2024): sentence chunking, dense + cross-encoder
retrieval, extractor (global information), CoT-guided filter (factual details) and generator.

Ray-free: the Serve deployments and jobs are thin shells over these modules.
"""
