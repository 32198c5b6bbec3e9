"""LRGinstruction: the fine-tuning data of dual-perspective LongRAG ("LongRAG: A Dual-Perspective
Retrieval-Augmented Generation Paradigm for Long-Context Question Answering", Zhao et al., 2024,
Section 3.2 and Appendix C). Ray-free: ``jobs.lrg_instruct`` runs it on Ray Data."""

from longrag.lrg.build import Input, build_lrg, read_records
from longrag.lrg.calls import llm_executor
from longrag.lrg.records import KINDS, BuildReport, InstructionRecord, LRGConfig, Sample, TeacherReply, TeacherRequest

__all__ = [
    "KINDS",
    "BuildReport",
    "Input",
    "InstructionRecord",
    "LRGConfig",
    "Sample",
    "TeacherReply",
    "TeacherRequest",
    "build_lrg",
    "llm_executor",
    "read_records",
]
