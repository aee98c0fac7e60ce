"""ECHO-2 components: a learner training on its workers' rollouts, workers following its policy. Transport-free and
node-free (narrow inputs: `LearnerHost`, `WorkerHost`, plain data); the join roles do the I/O around them.

Map:
- learner.py     `Learner`: buffer of worker groups (bound S), drafts for the node loop, policy updates to publish
- worker.py      `Worker`: follows the learner's policy (deltas, snapshots), may it generate within S, generate
- catch_up.py    `plan_catch_up`: which held update a worker fetches next, and when the lineage restarted
- admission.py   `Admission`: a learner's worker admission (Status in; delegate, activate, snapshot out)
- activation.py  `WorkerActivator`: which workers to start/stop by measured throughput and cost
- planning.py, plan_*.py  `swarm-node plan`: cheapest workers that keep a learner busy
"""
