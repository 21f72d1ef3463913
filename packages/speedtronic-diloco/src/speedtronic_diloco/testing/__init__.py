"""Test helpers that ship with the package: a loopback Hub server and a tiny DiLoCo node."""
