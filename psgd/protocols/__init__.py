"""Consistency protocols, one per module, each with its worker and server halves side by side."""
