"""The policy layer of the API process: admission, deadlines, engine supervision."""
