"""The node: one training process, driven by a rollout source (imports nothing here: torch loads with core).

Map:
- core.py       `Node`: setup (model, sampler, trainer, pool, checkpoints), `run(source)` = `for item in source:
                train_on(item)`, the lockstep halves `sample_and_share()` / `mix_and_train(item)`, eval, summary
- sources.py    rollout sources: `SequentialSource`, `OverlappedSource` (generation thread bounded by S)
- run_files.py  the run dir, metrics.jsonl (`StepLog`: the one place a step is recorded), `NodeEvents`,
                `RunSummary`
- build.py      `sampler_settings(cfg.sampler, sizes)`, `model_dir_for(cfg)`: what a node is built from
- hardware.py   `Hardware`: device, precision, the memory sizes chosen at start (`hw.sizes`, RUN_DIR/sizes.json),
                handed to the trainer and the sampler, and the memory guard after each step
"""
