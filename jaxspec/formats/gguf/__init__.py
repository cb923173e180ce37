"""GGUF files (llama.cpp's format): ``reader`` (header, metadata, tensor table, split files), ``config``
(metadata -> a Hugging Face-style config per architecture), ``tokenizer`` (the file's vocabulary as a
``tokenizers`` tokenizer, end-of-generation ids) and ``loader.load`` (a ``CausalLM``)."""
