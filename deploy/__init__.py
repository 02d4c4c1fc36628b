"""Transports (local, SSH), the inventory, remote apply and systemd units."""
