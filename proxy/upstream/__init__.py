"""Reaching the model servers (and peers): the connection pools, the relay of each answer, what it cost."""
