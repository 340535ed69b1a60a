"""Serving a tuned preset: the llama-server it runs, the front before it, the canary that checks
its answers against a reference build."""
