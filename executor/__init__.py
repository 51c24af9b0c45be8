"""executor: runs a plan on torch.distributed, measures it and verifies its numerics."""
