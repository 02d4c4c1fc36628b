"""The unit deployer: systemd units rendered from the inventory's settings and the host's
tree state, installed, restarted, waited for and rolled back on the host."""
