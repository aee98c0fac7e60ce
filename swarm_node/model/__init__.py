"""The model a node trains: built, loaded, adapted and saved. Nothing here knows about sharing or the network.

- `default_model.py`: the embedded default model (built in code, warmed up, cached) and loading any HF directory.
- `tokenizer.py`: the character-level tokenizer of the default model, and the tokenizer hash peers compare.
- `prompting.py`: a prompt format bound to a tokenizer (`Prompter`): the prompt ids of a task instance, through the
  chat template (date pinned) where the format uses one; the model's own format; the smallest budget a format needs.
- `bpe.py`: byte-level BPE tokenizers trained offline (digits one per token, special tokens, optional BOS).
- `shapes.py`: `SHAPES` (qwen2.5-instruct, llama-3-instruct) and `SIZES`: realistic HF model directories built offline.
- `warmup.py`: the reusable supervised warm-up (completion-token loss) and think-answer examples.
- `lora.py`: our LoRA layer (base weight names kept, peft's on-disk layout) and `WEIGHT_FORMS`, the tensors a
  sampler loads from a LoRA-trained model.
- `checkpoint.py`: atomic, crash-safe checkpoints of model, optimizer and run state; resume picks the newest whole one.
"""
