"""`atropos local serve`: an OpenAI- and vLLM-compatible inference server over transformers.

- `atropos.local.engine`: the generation thread, batching, weight reloads and adapters;
  `atropos.local.decode` (the batched decoding loop) and `atropos.local.weights` (loading and
  checking checkpoints). These import torch.
- `atropos.local.protocol`: request fields in; `atropos.local.responses`: vLLM-shaped answers
  out.
- `atropos.local.server`: the Starlette app and the uvicorn runner.
- `atropos.local.lora`: PEFT-format LoRA adapters: save, load, merge and unmerge.

Importing this package imports neither torch nor transformers; see docs/local.md.
"""
