"""Small programs that ship with the runtime (examples and test workloads)."""
