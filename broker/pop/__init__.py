"""POP consumption: receipt handles, checkpoints, revive, FIFO, long polling."""
