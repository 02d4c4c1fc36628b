"""A stand-in SGLang server (and router) for the test hosts: see install.py and payload/."""
