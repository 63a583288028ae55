"""API keys as rows: their secrets (`secrets`), what each allows (`scope`) and the table (`store`)."""
