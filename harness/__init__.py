"""oscar-eval harness: model adapters, the evaluation loop, results, benchmarks and the CLI."""
