"""The connection layer: the fleet (hosts.yaml or an Ansible inventory, and what it may
say about a host's units), how a HOST argument resolves to one host, and the ways to reach
it (in process, SSH with checked host keys, HTTP to its servers through the SSH
connection). Every command that touches a host goes through here."""
