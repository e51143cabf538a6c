"""Elastic asynchronous training: a server job that worker jobs join and leave while it trains."""
