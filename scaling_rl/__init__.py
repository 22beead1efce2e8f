"""scaling_rl: scaling studies in deep RL."""
__version__ = "0.1.0"
