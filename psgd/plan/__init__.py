"""psgd plan: the cost model of each protocol, the command that prints it, and --auto's
search over pipelines, tensor splits and protocols."""
