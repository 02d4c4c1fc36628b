"""Measuring a server: probes, drift (SGLang's logprob method) and its statistics and
decisions, the shipped conversations, the one JSON-over-HTTP client."""
