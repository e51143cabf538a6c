"""psgd plan: the cost model of each protocol and the command that prints it."""
