"""Files translated as jobs: formats (what to translate in a file and how to put it back), the
job store (SQLite and files under the data directory) and the runner that translates them."""
