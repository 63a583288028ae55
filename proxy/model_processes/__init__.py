"""The model server processes: started, watched, stopped, and found again after a crash; the machine they run on
(its GPUs' memory, the samples /metrics shows)."""
