"""The model server processes: started, watched, stopped, and found again after a crash."""
