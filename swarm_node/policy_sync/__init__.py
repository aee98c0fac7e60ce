"""Policy sync: how an ECHO-2 learner's policy reaches its workers, byte-exact, as versioned deltas.

- `codecs.py`: delta encodings, registry `CODECS` (full, dense-bf16, top-k sparse), safetensors payloads.
- `delta.py`: `PolicyPublisher` (error feedback, W_pub bit-identical at every follower) and `PolicyFollower`.
- `broadcast.py`: `PolicyBroadcaster`, the facade: announce on gossip, chunks over direct streams, relayed
  downstream as they arrive (the relay plan is `protocol/relay.py`'s).
- `store.py`: the versions held (announce, chunks, completion) and what they serve to late joiners.
- `serve.py`: answers chunk and catalog requests.
- `pull.py`: drives the receivers: pulls chunks, relays them, fetches catalogs.
- `streams.py`: bounded frame reads, shaped chunk I/O, the background task set.
"""
