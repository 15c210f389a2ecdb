"""The search: the space, the CP-SAT model, brute force, and the driver that orchestrates them."""
