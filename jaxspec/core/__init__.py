"""The pieces every other package builds on, importing nothing else of jaxspec: the model contract
(``model.CausalLM``), the KV cache (``cache``), warping and categorical draws (``sampling``), the rejection sampler
(``acceptance.RejectionSampler``) and the dtype table (``dtypes``)."""
