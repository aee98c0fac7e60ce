"""Real components together: vLLM, libp2p child processes, network namespaces, multi-node simulations."""
