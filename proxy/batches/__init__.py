"""OpenAI's Files and Batch APIs: a JSONL file of requests run one line at a time through the scheduler,
at batch priority, and their answers collected into output and error files.

storage.py keeps the files under the data dir; lines.py checks an input file's lines; upload.py streams
an upload to disk while checking it; objects.py renders rows as OpenAI objects; batch_rows.py holds every
database step; line_request.py sends one line through the scheduler; runner.py runs the batches; views.py
is the HTTP side."""
