"""Training, apart from the inference packages: the dual pipeline's reranker (its data,
:mod:`longrag.training.reranker_data`, and its fine-tuning, :mod:`longrag.training.reranker`) and the
LoRA fine-tuning of a reader on LRGinstruction (:mod:`longrag.training.sft`). Ray-free; the jobs
``jobs.train_reranker`` and ``jobs.finetune`` run them."""
