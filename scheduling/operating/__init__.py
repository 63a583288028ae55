"""The operators' pages: the overview and its charts, settings edited live and previewed by replay."""
