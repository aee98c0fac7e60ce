"""The node: one training process, driven by a rollout source (imports nothing here: torch loads with core).

Map:
- core.py       `Node`: setup (model, sampler, trainer, checkpoints), `run(source)` = `for item in source:
                train_on(item)`, its own generation as a source (`local_source`), the halves `draft()` /
                `mix_and_train(item)`, eval; sealed once set up
- assembly.py   `assemble(cfg, sharing, ...)`: the one place a node is put together with what it shares with (the
                SAPO peer, the peer guard, the share context, the ECHO-2 learner/worker); roles, simulations and
                benchmarks all call it
- sources.py    rollout sources: `SequentialSource`, `OverlappedSource` (generation thread bounded by S),
                `SharingSource` (a SAPO peer around either)
- resume.py     checkpoints: the node's random streams, save, resume from the newest
- run_files.py  the run dir, metrics.jsonl (`StepLog`: the one place a step is recorded), `NodeEvents`,
                `RunSummary`
- build.py      `sampler_settings(cfg.sampler, sizes, dtype)`, `model_dir_for(cfg)`: what a node is built from
- hardware.py   `Hardware`: device, precision, the memory sizes chosen at start (`hw.sizes`, RUN_DIR/sizes.json),
                handed to the trainer and the sampler, and the memory guard after each step
"""
