"""The model a node trains: built, loaded, adapted and saved. Nothing here knows about sharing or the network.

- `default_model.py`: the embedded model's cache (built from a recipe on first use) and loading any HF directory.
- `recipes.py`: `MODEL_RECIPES`, the embedded model's recipes by name (`model.recipe`): `think_recipe.py`
  (`bpe-think-answer-v2`, the default: Qwen2.5-shaped, warmed up on think-answer traces), `char_recipe.py`
  (`char-answer-line-v1`, the earlier default); `recipe_mixes.py`: the task mixes they are pinned to.
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
